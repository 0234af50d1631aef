"""What the model sees of the desktop: the accessibility tree as OSWorld's agents read it, one line per
visible element (`tag`, `name`, `text`, position, size, tab-separated), the way OSWorld linearises its
tree for `a11y_tree` observations; a screenshot (PNG) for `screenshot`; both for `screenshot_a11y_tree`."""

from __future__ import annotations

import re
from dataclasses import dataclass

ST = "{https://accessibility.ubuntu.example.org/ns/state}"
CP = "{https://accessibility.ubuntu.example.org/ns/component}"
HEADER = "tag\tname\ttext\tposition (top-left x&y)\tsize (w&h)"
KEPT_TAGS = {   # roles a person acts on or reads; containers (filler, panel) only hold these
    "push-button", "toggle-button", "check-box", "radio-button", "menu", "menu-item", "check-menu-item",
    "radio-menu-item", "text", "entry", "password-text", "label", "link", "combo-box", "list-item", "table-cell",
    "page-tab", "tool-bar", "icon", "terminal", "document-text", "document-spreadsheet", "paragraph", "heading",
    "spin-button", "slider", "scroll-bar", "tree-item", "image", "frame", "dialog", "alert", "status-bar",
    "canvas", "table-column-header", "table-row-header", "editbar", "section", "notification",
}


@dataclass(frozen=True)
class DesktopObservation:
    """One observation of the desktop, as the observation type asks: the linearised tree, a screenshot,
    or both; `note` is what the agent is told first (an action the desktop could not carry out)."""

    tree: str | None = None
    screenshot: bytes | None = None
    note: str = ""

    def __str__(self) -> str:   # trajectory dumps: the text, the screenshot by size only
        parts = [self.note] if self.note else []
        if self.screenshot is not None:
            parts.append(f"[screenshot: PNG, {len(self.screenshot)} bytes]")
        if self.tree is not None:
            parts.append(self.tree)
        return "\n\n".join(parts)


_PAIR = re.compile(r"\((-?\d+), (-?\d+)\)")


def linearize(xml: str, width: int, height: int, max_chars: int) -> str:
    """The tree's visible, on-screen elements, one per line; cut to max_chars with a note."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(xml)
    lines = [HEADER]
    for element in root.iter():
        if element.tag not in KEPT_TAGS:
            continue
        if element.get(f"{ST}showing") != "true" or element.get(f"{ST}visible") != "true":
            continue
        where, size = _PAIR.match(element.get(f"{CP}screencoord", "")), _PAIR.match(element.get(f"{CP}size", ""))
        if not where or not size:
            continue
        x, y, w, h = int(where[1]), int(where[2]), int(size[1]), int(size[2])
        if w <= 0 or h <= 0 or x >= width or y >= height or x + w <= 0 or y + h <= 0:
            continue
        name = element.get("name", "")
        text = (element.text or "").replace("\t", " ")
        if element.tag == "terminal" or len(text) > 1000:   # a terminal's scroll-back: its last lines
            text = "\\n".join(text.rstrip("\n").split("\n")[-30:])
        else:
            text = text.replace("\n", "\\n")
        if not name and not text and element.tag not in ("push-button", "check-box", "entry", "text"):
            continue
        lines.append(f"{element.tag}\t{name}\t{text}\t({x}, {y})\t({w}, {h})")
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... the tree was cut at {max_chars} characters (env.max_observation_chars) ...]"
    return text


def terminal_text(xml: str) -> str | None:
    """The text of the desktop's terminals (OSWorld's vm_terminal_output), None when none is open."""
    import xml.etree.ElementTree as ET

    texts = [element.text or "" for element in ET.fromstring(xml).iter("terminal")]
    return "\n".join(texts) if texts else None
