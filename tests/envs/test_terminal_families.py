"""Procedural terminal task families: every family and level solved by its oracle and by no one who
does nothing (in a real bubblewrap sandbox, through `dockyard env check`), the same bytes from the same
plan, splits that share nothing that could be memorised, and bad parameters refused by name."""

import hashlib
import json
import os

import pytest

from dockyard.envs.terminal_families.splits import FAMILIES, SHARED_BYTES, PlanError, SplitPlan, generate
from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import run_cli

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")


def tree(folder):
    """path -> (mode, sha256) of every file under folder."""
    return {str(p.relative_to(folder)): (os.stat(p).st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@needs_bwrap
@pytest.mark.parametrize("agent,reward", [("oracle", "1.00"), ("noop", "0.00")])
def test_every_family_and_level_is_solved_by_its_oracle_and_not_by_doing_nothing(agent, reward, tmp_path_factory):
    out = tmp_path_factory.mktemp("families") / "set"
    # one task of each level of each family: train takes the trained ones, unseen the other two
    generate(SplitPlan(train_per_family=3, heldout_per_family=0, unseen_per_family=3), out)
    for split in ("train", "unseen"):
        result = run_cli("env", "check", "--config", "grpo_terminal_bench_local", "--tasks", str(out / f"{split}.jsonl"),
                         "--agent", agent)
        rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] and "-" in line.split()[0]
                and line.split()[0].rsplit("-", 2)[0] in FAMILIES]
        assert rows and all(row[1] == reward for row in rows), result.stdout + result.stderr
        assert len(rows) == (30 if split == "train" else 6), result.stdout


def test_the_same_plan_writes_the_same_bytes_and_another_seed_other_tasks(tmp_path):
    plan = SplitPlan(train_per_family=2, heldout_per_family=1, unseen_per_family=1)
    generate(plan, tmp_path / "a")
    generate(plan, tmp_path / "b")
    first = tree(tmp_path / "a")
    assert first == tree(tmp_path / "b") and len(first) > 200
    assert any(path.endswith("solution.sh") and mode & 0o111 for path, (mode, _) in first.items())
    generate(SplitPlan(seed=1, train_per_family=2, heldout_per_family=1, unseen_per_family=1), tmp_path / "c")
    instructions = {seed: [json.loads(line)["instruction"] for line in (tmp_path / seed / "train.jsonl").open()]
                    for seed in ("a", "c")}
    assert len(instructions["a"]) == len(instructions["c"]) == 20
    assert sum(a != c for a, c in zip(instructions["a"], instructions["c"])) > 10


def test_the_splits_share_nothing_that_could_be_memorised(tmp_path):
    counts = generate(SplitPlan(), tmp_path)
    assert counts == {"train": 240, "heldout": 60, "unseen": 12}

    def rows(split):
        return [json.loads(line) for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]

    def contents(split):
        return {p.read_text() for p in (tmp_path / split).rglob("files/**/*") if p.is_file()}

    train_families = {r["task"]["family"] for r in rows("train")}
    assert {r["task"]["family"] for r in rows("unseen")} == {"log_summary", "csv_join"}
    assert not train_families & {"log_summary", "csv_join"} and len(train_families) == 10
    assert {r["task"]["family"] for r in rows("heldout")} == train_families
    shared = {text for text in contents("train") & contents("heldout") if len(text) > SHARED_BYTES}
    assert not shared, sorted(shared)[:3]
    assert {r["task"]["level"] for r in rows("heldout")} == {1, 2, 3}
    assert all((tmp_path / r["task"]["path"] / "task.yaml").is_file() for r in rows("heldout"))


def test_bad_parameters_are_refused_by_name(tmp_path):
    result = run_cli("env", "generate", "--out", str(tmp_path / "x"), "--train", "0", "--unseen", "grep_lines",
                     "--levels", "4")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    for named in ("train_per_family", "'grep_lines' is not a family", "unseen:", "levels:"):
        assert named in result.stderr, result.stderr
    assert not (tmp_path / "x").exists()
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "kept.txt").write_text("mine")
    with pytest.raises(PlanError, match="not empty"):
        generate(SplitPlan(), tmp_path / "y")
    assert (tmp_path / "y" / "kept.txt").read_text() == "mine"
