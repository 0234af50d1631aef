"""Regenerate docs/config-reference.md from the schema (run after changing a config field)."""

from pathlib import Path

from dockyard.config.reference import render

target = Path(__file__).resolve().parent.parent / "docs" / "config-reference.md"
target.write_text(render(), encoding="utf-8")
print(f"wrote {target}")
