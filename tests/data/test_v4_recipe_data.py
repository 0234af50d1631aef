"""The V4 recipe's datasets (tools/v4_recipe.py data): what each stage's config reads, and no held-out
question in any training file, the student's general SFT file included."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import v4_recipe  # noqa: E402


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def question(messages: list[dict]) -> str:
    return messages[0]["content"].removesuffix(f"\n{v4_recipe.INSTRUCTION}")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("v4data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKYARD_DATA_DIR", str(root))
        v4_recipe.make_data()
    return root


def test_general_sft_is_every_domain_conversation_and_nothing_else(data):
    general = rows(data / "sft" / "general.jsonl")
    per_domain = [row for domain in v4_recipe.DOMAINS for row in rows(data / "sft" / f"{domain}.jsonl")]
    assert sorted(map(json.dumps, general)) == sorted(map(json.dumps, per_domain))
    # shuffled: a stage-1 run of 20 steps sees both domains, not the first domain only
    first = {question(r["messages"]).startswith("How many times") for r in general[:32]}
    assert first == {True, False}
    val = rows(data / "sft" / "general_val.jsonl")
    assert len(val) == v4_recipe.SIZES["sft_val"] and all(r["label"] for r in val)


def test_no_heldout_question_in_any_training_file(data):
    held = {r["input"] for domain in v4_recipe.DOMAINS for r in rows(data / "heldout" / f"{domain}.jsonl")}
    assert len(held) > 100
    for name in [*v4_recipe.DOMAINS, "general"]:
        for part in (name, f"{name}_val"):
            trained = {question(r["messages"]) for r in rows(data / "sft" / f"{part}.jsonl")}
            assert not trained & held, part
    prompts = {r["input"] for r in rows(data / "consolidation" / "prompts.jsonl")}
    assert prompts and not prompts & held
