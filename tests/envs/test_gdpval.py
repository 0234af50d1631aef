"""gdpval: deliverables graded by their tasks' checks (csv, markdown, xlsx, docx), single shot from the
reply and agentic from a real bubblewrap sandbox driven through the agent's shell, tasks left out by
name, and `dockyard env check` on the shipped set both ways."""

import io
import json

import pytest

from dockyard.agents.tool_format import Action
from dockyard.config import load_config
from dockyard.config.schema.data import DatasetConfig
from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import load_prompts
from dockyard.envs.check import check
from dockyard.envs.gdpval import GdpvalEnvironment, extract_deliverable
from dockyard.envs.gdpval_files import RubricError, grade, read_rubric
from dockyard.sandboxes.bubblewrap import bwrap_path
from tests.conftest import REPO

SHIPPED = REPO / "tasks" / "gdpval" / "tasks.jsonl"
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not installed (tools/install.sh)")


def prompts(env, path=SHIPPED):
    return env.prepare_prompts(load_prompts(DatasetConfig(path=str(path), input_key="prompt", label_key="rubric",
                                                          metadata_key=None)))


def single_shot() -> GdpvalEnvironment:
    return GdpvalEnvironment(EnvConfig(name="gdpval", output_formats=["md", "csv"]))


def test_a_csv_deliverable_earns_the_points_of_the_checks_it_passes(capsys):
    env = single_shot()
    summary = next(p for p in prompts(env) if p.metadata["task_id"] == "sales-summary")
    assert "Deliverable: summary.csv" in summary.input
    perfect = "Here it is:\n```csv\nregion,total\nNorth,3600.00\nSouth,2750.25\nWest,2070.50\n```"
    assert env.score(perfect, summary) == 1.0
    # South summed wrong: 2 of the 9 points lost
    assert env.score(perfect.replace("2750.25", "2750.00"), summary) == pytest.approx(7 / 9)
    assert env.score("I summed the regions.", summary) == 0.0 and not env.action_valid("I summed the regions.")
    assert "cannot be written in a reply" not in capsys.readouterr().err   # binary tasks are out by format here


def test_markdown_checks_headings_words_and_text():
    env = single_shot()
    memo = next(p for p in prompts(env) if p.metadata["task_id"] == "meeting-memo")
    solution = (REPO / "tasks" / "gdpval" / memo.metadata["reference_solution"]).read_text()
    assert env.score(solution, memo) == 1.0        # a markdown file may be the whole reply
    without_decisions = solution.replace("## Decisions", "## Choices")
    assert env.score(without_decisions, memo) == pytest.approx(6 / 8)
    rambling = solution + "\nmore words" * 200
    assert env.score(rambling, memo) == pytest.approx(7 / 8)


def test_binary_deliverables_are_read_from_xlsx_and_docx(tmp_path):
    rubric = json.loads(json.loads(SHIPPED.read_text().splitlines()[4])["rubric"])
    solutions = REPO / "tasks" / "gdpval" / "solutions"
    assert grade(rubric, solutions / "budget-workbook" / "budget.xlsx")[0] == 1.0
    import openpyxl

    book = openpyxl.load_workbook(solutions / "budget-workbook" / "budget.xlsx")
    book["Budget"]["B6"] = 12000
    book.save(tmp_path / "budget.xlsx")
    score, lines = grade(rubric, tmp_path / "budget.xlsx")
    assert score == pytest.approx(3 / 5) and any(line.startswith("FAIL Amount where Category='Total'") for line in lines)
    (tmp_path / "broken.xlsx").write_bytes(b"PK\x03\x04 not really a workbook")
    score, lines = grade({**rubric, "deliverable": "broken.xlsx"}, tmp_path / "broken.xlsx")
    assert score == 0.0 and "cannot be read" in lines[0]
    letter = json.loads(json.loads(SHIPPED.read_text().splitlines()[5])["rubric"])
    assert grade(letter, solutions / "cover-letter" / "cover_letter.docx")[0] == 1.0


def test_bad_rubrics_and_tasks_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(RubricError, match="needs a deliverable"):
        read_rubric({"checks": [{"check": "contains", "text": "x"}]})
    with pytest.raises(RubricError, match="check 0: `check` must be one of"):
        read_rubric({"deliverable": "a.md", "checks": [{"check": "looks_good"}]})
    with pytest.raises(RubricError, match="must be a plain file name"):
        read_rubric({"deliverable": "../a.md", "checks": [{"check": "contains", "text": "x"}]})
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    rows[0]["rubric"] = "{not json"
    rows[2]["reference_files"] = ["reference/nowhere.json"]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "reference").symlink_to(REPO / "tasks" / "gdpval" / "reference")
    kept = prompts(single_shot(), path)
    assert [p.metadata["task_id"] for p in kept] == ["meeting-memo", "job-posting"]
    err = capsys.readouterr().err
    assert f"gdpval: {path}: task sales-summary: the rubric is not JSON" in err
    assert "task invoice-lines: reference file" in err and "nowhere.json not found" in err
    assert "task budget-workbook: its xlsx deliverable is not in env.output_formats" in err
    with pytest.raises(ValueError, match="env.grader: 'judge' is not built"):
        GdpvalEnvironment(EnvConfig(name="gdpval", grader="judge"))
    with pytest.raises(ValueError, match="env.tool_format: a setting of the agentic gdpval"):
        GdpvalEnvironment(EnvConfig(name="gdpval", tool_format="plain"))
    with pytest.raises(ValueError, match="env.sandbox: single-shot gdpval runs nothing"):
        GdpvalEnvironment(EnvConfig(name="gdpval", sandbox=SandboxConfig()))


@needs_bwrap
def test_an_agentic_episode_is_graded_on_the_file_the_agent_left_in_its_sandbox():
    env = GdpvalEnvironment(EnvConfig(name="gdpval", agent="tool_calling", sandbox=SandboxConfig(
        type="bubblewrap", command_exec_timeout_s=30, memory_mb=1024, max_processes=64)))
    workbook = next(p for p in prompts(env) if p.metadata["task_id"] == "budget-workbook")
    assert "The reference files are in /workspace/reference/" in workbook.input
    episode = env.open(workbook)
    try:
        assert "Rent,2400" in episode.execute(Action("tool", "bash", {"command": "cat reference/expenses.csv"}))
        script = ("python3 - <<'EOF'\nimport csv, openpyxl\nrows = list(csv.DictReader(open('reference/expenses.csv')))\n"
                  "book = openpyxl.Workbook(); sheet = book.active; sheet.title = 'Budget'\n"
                  "sheet.append(['Category', 'Amount'])\nfor r in rows: sheet.append([r['category'], float(r['amount'])])\n"
                  "sheet.append(['Total', sum(float(r['amount']) for r in rows)])\nbook.save('budget.xlsx')\nEOF")
        assert "exit status 0" in episode.execute(Action("tool", "bash", {"command": script}))
        assert episode.finish() == 1.0
        assert episode.events[-1]["checks"][0].startswith("pass")
    finally:
        episode.close()
    empty = env.open(workbook)
    try:
        assert empty.finish() == 0.0 and empty.events[-1]["checks"] == ["no deliverable budget.xlsx"]
    finally:
        empty.close()


@needs_bwrap
@pytest.mark.parametrize("config,count", [("grpo_gdpval_local.yaml", 4), ("grpo_gdpval_agentic_local.yaml", 6)])
def test_env_check_on_the_shipped_set(config, count):
    cfg = load_config(config, ["models_dir=models"]).config
    for agent, mean in (("oracle", "1.00"), ("noop", "0.00")):
        out = io.StringIO()
        assert check(cfg, cfg.data.datasets[0].path, agent, out) == 0, out.getvalue()
        assert f"mean reward {mean} over {count} tasks" in out.getvalue()


def test_the_deliverable_is_the_last_fenced_block():
    assert extract_deliverable("a\n```csv\nx,y\n```\nthen\n```\nz\n```", "f.csv") == "z\n"
    assert extract_deliverable("no fence", "f.csv") is None
    assert extract_deliverable("# Title\ntext", "f.md") == "# Title\ntext\n"
