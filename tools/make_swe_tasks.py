"""Writes the shipped SWE task sets (tasks/swe): two small git repositories as bundles and the task
rows in the published formats, SWE-bench (swe_bench.jsonl) and SWE-bench Pro (swe_pro.jsonl).

Every commit has fixed names and dates, so the commit ids in the rows are the same on every machine.
Run from the repository root: python tools/make_swe_tasks.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

OUT = Path("tasks/swe")
GIT_ENV = {"GIT_AUTHOR_NAME": "dockyard", "GIT_AUTHOR_EMAIL": "tasks@dockyard.invalid",
           "GIT_COMMITTER_NAME": "dockyard", "GIT_COMMITTER_EMAIL": "tasks@dockyard.invalid",
           "GIT_AUTHOR_DATE": "2026-01-05T12:00:00Z", "GIT_COMMITTER_DATE": "2026-01-05T12:00:00Z",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null"}

REPOS = {
    "dockyard-tasks/textkit": {
        "README.md": "# textkit\n\nSmall text helpers: slugs, word wrap, title case.\n",
        "textkit/__init__.py": "from textkit.case import titlecase\nfrom textkit.slug import slugify\n"
                               "from textkit.wrap import wrap\n\n__all__ = [\"slugify\", \"titlecase\", \"wrap\"]\n",
        "textkit/slug.py": 'import re\n\n\ndef slugify(text: str) -> str:\n'
                           '    """Lower-case words joined by single dashes: \'Hello, World!\' -> \'hello-world\'."""\n'
                           '    text = text.strip().lower()\n'
                           '    text = re.sub(r"[^a-z0-9]", "-", text)\n'
                           '    return text.strip("-")\n',
        "textkit/wrap.py": 'def wrap(text: str, width: int) -> list[str]:\n'
                           '    """Greedy word wrap: lines of at most `width` characters; a longer word gets a line of its own."""\n'
                           '    lines, current = [], ""\n'
                           '    for word in text.split():\n'
                           '        if current and len(current) + 1 + len(word) >= width:\n'
                           '            lines.append(current)\n'
                           '            current = word\n'
                           '        else:\n'
                           '            current = f"{current} {word}" if current else word\n'
                           '    if current:\n'
                           '        lines.append(current)\n'
                           '    return lines\n',
        "textkit/case.py": 'def titlecase(text: str) -> str:\n'
                           '    """Capitalise the first letter of each word: "it\'s a dog\'s life" -> "It\'s A Dog\'s Life"."""\n'
                           '    return text.title()\n',
        "tests/test_slug.py": "from textkit import slugify\n\n\ndef test_slugify_lowercases():\n"
                              "    assert slugify(\"Hello\") == \"hello\"\n",
        "tests/test_wrap.py": "from textkit import wrap\n\n\ndef test_wrap_long_word():\n"
                              "    assert wrap(\"abcdefgh ij\", 4) == [\"abcdefgh\", \"ij\"]\n",
        "tests/test_case.py": "from textkit import titlecase\n\n\ndef test_titlecase_words():\n"
                              "    assert titlecase(\"hello world\") == \"Hello World\"\n",
    },
    "dockyard-tasks/minicalc": {
        "README.md": "# minicalc\n\nStatistics and durations for small scripts.\n",
        "minicalc/__init__.py": "from minicalc.duration import parse_duration\nfrom minicalc.stats import mean, median\n\n"
                                "__all__ = [\"mean\", \"median\", \"parse_duration\"]\n",
        "minicalc/stats.py": "def mean(values):\n    \"\"\"The arithmetic mean of a non-empty sequence.\"\"\"\n"
                             "    return sum(values) / len(values)\n\n\n"
                             "def median(values):\n    \"\"\"The middle value of a non-empty sequence.\"\"\"\n"
                             "    ordered = sorted(values)\n    return ordered[len(ordered) // 2]\n",
        "minicalc/duration.py": 'import re\n\nUNITS = {"s": 1, "m": 60, "h": 3600}\n\n\n'
                                'def parse_duration(text: str) -> int:\n'
                                '    """Seconds in a duration: \'90s\' -> 90, \'2m\' -> 120, \'1h\' -> 3600."""\n'
                                '    match = re.fullmatch(r"(\\d+)([smh])", text.strip())\n'
                                '    if not match:\n'
                                '        raise ValueError(f"not a duration: {text!r}")\n'
                                '    return int(match.group(1)) * UNITS[match.group(2)]\n',
        "tests/test_stats.py": "from minicalc import mean, median\n\n\ndef test_mean():\n"
                               "    assert mean([1, 2, 3, 6]) == 3\n\n\ndef test_median_odd():\n"
                               "    assert median([5, 1, 3]) == 3\n",
        "tests/test_duration.py": "import pytest\n\nfrom minicalc import parse_duration\n\n\n"
                                  "def test_single_unit():\n    assert parse_duration(\"90s\") == 90\n"
                                  "    assert parse_duration(\"2h\") == 7200\n\n\n"
                                  "def test_rejects_garbage():\n    with pytest.raises(ValueError):\n"
                                  "        parse_duration(\"soon\")\n",
    },
}

# Each task: the fix (files as they should read), the tests that show it (files as they read after
# the test patch), the issue text, and for SWE-bench Pro its requirements and interface.
TASKS = [
    {"repo": "dockyard-tasks/textkit", "id": "slugify-collapse",
     "issue": "slugify leaves several dashes in a row\n\n`slugify(\"Hello, World!\")` returns `hello--world`; "
              "a run of punctuation and spaces should become one dash: `hello-world`.",
     "fix": {"textkit/slug.py": lambda s: s.replace('r"[^a-z0-9]"', 'r"[^a-z0-9]+"')},
     "tests": {"tests/test_slug.py": lambda s: s + "\n\ndef test_slugify_collapses_separators():\n"
               "    assert slugify(\"Hello, World!\") == \"hello-world\"\n"
               "    assert slugify(\"  a -- b  \") == \"a-b\"\n"},
     "f2p": ["tests/test_slug.py::test_slugify_collapses_separators"], "p2p": ["tests/test_slug.py::test_slugify_lowercases"]},
    {"repo": "dockyard-tasks/textkit", "id": "wrap-exact-width",
     "issue": "wrap breaks lines that fit exactly\n\n`wrap(\"aa bb cc\", 5)` gives `[\"aa\", \"bb\", \"cc\"]`, but "
              "`\"aa bb\"` is 5 characters and fits a width of 5: expected `[\"aa bb\", \"cc\"]`.",
     "fix": {"textkit/wrap.py": lambda s: s.replace(">= width", "> width")},
     "tests": {"tests/test_wrap.py": lambda s: s + "\n\ndef test_wrap_line_of_exact_width():\n"
               "    assert wrap(\"aa bb cc\", 5) == [\"aa bb\", \"cc\"]\n"},
     "f2p": ["tests/test_wrap.py::test_wrap_line_of_exact_width"], "p2p": ["tests/test_wrap.py::test_wrap_long_word"]},
    {"repo": "dockyard-tasks/textkit", "id": "titlecase-apostrophes",
     "issue": "titlecase capitalises after apostrophes\n\n`titlecase(\"it's a dog's life\")` returns "
              "`It'S A Dog'S Life`; only the first letter of each word should be upper case: `It's A Dog's Life`.",
     "fix": {"textkit/case.py": lambda s: s.replace("    return text.title()\n",
                                                    "    return \" \".join(word[:1].upper() + word[1:].lower() "
                                                    "for word in text.split(\" \"))\n")},
     "tests": {"tests/test_case.py": lambda s: s + "\n\ndef test_titlecase_apostrophes():\n"
               "    assert titlecase(\"it's a dog's life\") == \"It's A Dog's Life\"\n"},
     "f2p": ["tests/test_case.py::test_titlecase_apostrophes"], "p2p": ["tests/test_case.py::test_titlecase_words"]},
    {"repo": "dockyard-tasks/minicalc", "id": "mean-empty",
     "issue": "mean([]) raises ZeroDivisionError\n\nThe mean of no values should raise `ValueError(\"mean of no "
              "values\")`, so callers can catch bad input the same way everywhere.",
     "fix": {"minicalc/stats.py": lambda s: s.replace("    return sum(values) / len(values)\n",
                                                      "    if not values:\n        raise ValueError(\"mean of no values\")\n"
                                                      "    return sum(values) / len(values)\n")},
     "tests": {"tests/test_stats.py": lambda s: "import pytest\n\n" + s + "\n\ndef test_mean_of_nothing_raises():\n"
               "    with pytest.raises(ValueError, match=\"no values\"):\n        mean([])\n"},
     "f2p": ["tests/test_stats.py::test_mean_of_nothing_raises"],
     "p2p": ["tests/test_stats.py::test_mean", "tests/test_stats.py::test_median_odd"]},
    {"repo": "dockyard-tasks/minicalc", "id": "median-even",
     "issue": "median is wrong for an even number of values\n\n`median([1, 2, 3, 4])` returns 3; the median of an "
              "even count is the mean of the two middle values, 2.5.",
     "fix": {"minicalc/stats.py": lambda s: s.replace("    return ordered[len(ordered) // 2]\n",
                                                      "    middle = len(ordered) // 2\n    if len(ordered) % 2 == 0:\n"
                                                      "        return (ordered[middle - 1] + ordered[middle]) / 2\n"
                                                      "    return ordered[middle]\n")},
     "tests": {"tests/test_stats.py": lambda s: s + "\n\ndef test_median_even():\n"
               "    assert median([4, 1, 3, 2]) == 2.5\n"},
     "f2p": ["tests/test_stats.py::test_median_even"],
     "p2p": ["tests/test_stats.py::test_mean", "tests/test_stats.py::test_median_odd"]},
    {"repo": "dockyard-tasks/minicalc", "id": "duration-combined",
     "issue": "parse_duration rejects combined units\n\n`parse_duration(\"1h30m\")` raises ValueError; it should "
              "add the parts up (5400). `\"2m5s\"` is 125.",
     "fix": {"minicalc/duration.py": lambda s: s.replace(
         '    match = re.fullmatch(r"(\\d+)([smh])", text.strip())\n    if not match:\n'
         '        raise ValueError(f"not a duration: {text!r}")\n    return int(match.group(1)) * UNITS[match.group(2)]\n',
         '    text = text.strip()\n    if not re.fullmatch(r"(?:\\d+[smh])+", text):\n'
         '        raise ValueError(f"not a duration: {text!r}")\n'
         '    return sum(int(number) * UNITS[unit] for number, unit in re.findall(r"(\\d+)([smh])", text))\n')},
     "tests": {"tests/test_duration.py": lambda s: s + "\n\ndef test_combined_units():\n"
               "    assert parse_duration(\"1h30m\") == 5400\n    assert parse_duration(\"2m5s\") == 125\n"},
     "f2p": ["tests/test_duration.py::test_combined_units"],
     "p2p": ["tests/test_duration.py::test_single_unit", "tests/test_duration.py::test_rejects_garbage"]},
]

# SWE-bench Pro: longer tasks that touch several files, with requirements and an interface.
PRO_TASKS = [
    {"repo": "dockyard-tasks/minicalc", "id": "format-duration",
     "issue": "Add a way to print durations\n\nScripts parse durations with parse_duration but have no way to "
              "print one back. Add format_duration, the inverse.",
     "requirements": "- format_duration(seconds) returns the hours, minutes and seconds parts that are not zero, "
                     "largest first, with units h, m, s and no spaces: 5400 -> \"1h30m\", 125 -> \"2m5s\".\n"
                     "- format_duration(0) returns \"0s\".\n- A negative number raises ValueError.\n"
                     "- format_duration is exported from the package, like parse_duration.",
     "interface": "minicalc.format_duration(seconds: int) -> str, in minicalc/duration.py",
     "fix": {"minicalc/duration.py": lambda s: s + '\n\ndef format_duration(seconds: int) -> str:\n'
             '    """The inverse of parse_duration: 5400 -> \'1h30m\', 0 -> \'0s\'."""\n'
             '    if seconds < 0:\n        raise ValueError(f"negative duration: {seconds}")\n'
             '    parts = []\n    for unit in ("h", "m", "s"):\n        count, seconds = divmod(seconds, UNITS[unit])\n'
             '        if count:\n            parts.append(f"{count}{unit}")\n    return "".join(parts) or "0s"\n',
             "minicalc/__init__.py": lambda s: s.replace("from minicalc.duration import parse_duration",
                                                         "from minicalc.duration import format_duration, parse_duration")
             .replace('__all__ = ["mean"', '__all__ = ["format_duration", "mean"')},
     "tests": {"tests/test_format.py": lambda s: "import pytest\n\nfrom minicalc import format_duration, parse_duration\n\n\n"
               "def test_format_duration():\n    assert format_duration(5400) == \"1h30m\"\n"
               "    assert format_duration(125) == \"2m5s\"\n    assert format_duration(3600) == \"1h\"\n\n\n"
               "def test_format_zero_and_negative():\n    assert format_duration(0) == \"0s\"\n"
               "    with pytest.raises(ValueError):\n        format_duration(-1)\n\n\n"
               "def test_round_trip():\n    for seconds in (1, 59, 120, 3600, 86400):\n"
               "        assert parse_duration(format_duration(seconds)) == seconds\n"},
     "f2p": ["tests/test_format.py::test_format_duration", "tests/test_format.py::test_format_zero_and_negative",
             "tests/test_format.py::test_round_trip"],
     "p2p": ["tests/test_duration.py::test_single_unit", "tests/test_duration.py::test_rejects_garbage"],
     "run": ["tests/test_format.py", "tests/test_duration.py"]},
    {"repo": "dockyard-tasks/textkit", "id": "slug-separator-accents",
     "issue": "slugify: accented letters vanish, and the separator is fixed\n\n`slugify(\"Crème brûlée\")` gives "
              "`cr-me-br-l-e`. Accented letters should keep their base letter, and callers need other "
              "separators (underscores for file names).",
     "requirements": "- Accented Latin letters become their base letter: \"Crème brûlée\" -> \"creme-brulee\".\n"
                     "- slugify takes a keyword argument separator (default \"-\") used between words; runs of "
                     "other characters still become one separator.\n"
                     "- A helper textkit.ascii.fold(text) returns the text with accents removed (NFKD, combining "
                     "marks dropped).",
     "interface": "textkit.slugify(text: str, separator: str = \"-\") -> str; textkit.ascii.fold(text: str) -> str "
                  "(new module textkit/ascii.py)",
     "fix": {"textkit/ascii.py": lambda s: 'import unicodedata\n\n\ndef fold(text: str) -> str:\n'
             '    """The text without accents: \'crème\' -> \'creme\'."""\n'
             '    decomposed = unicodedata.normalize("NFKD", text)\n'
             '    return "".join(char for char in decomposed if not unicodedata.combining(char))\n',
             "textkit/slug.py": lambda s: 'import re\n\nfrom textkit.ascii import fold\n\n\n'
             'def slugify(text: str, separator: str = "-") -> str:\n'
             '    """Lower-case words joined by single separators: \'Hello, World!\' -> \'hello-world\'."""\n'
             '    text = fold(text).strip().lower()\n'
             '    text = re.sub(r"[^a-z0-9]+", separator, text)\n'
             '    return text.strip(separator)\n'},
     "tests": {"tests/test_slug.py": lambda s: s + "\n\ndef test_slug_accents():\n"
               "    assert slugify(\"Crème brûlée\") == \"creme-brulee\"\n\n\n"
               "def test_slug_separator():\n    assert slugify(\"Hello, World!\", separator=\"_\") == \"hello_world\"\n",
               "tests/test_ascii.py": lambda s: "from textkit.ascii import fold\n\n\ndef test_fold():\n"
               "    assert fold(\"Ångström café\") == \"Angstrom cafe\"\n"},
     "f2p": ["tests/test_slug.py::test_slug_accents", "tests/test_slug.py::test_slug_separator",
             "tests/test_ascii.py::test_fold"],
     "p2p": ["tests/test_slug.py::test_slugify_lowercases"],
     "run": ["tests/test_slug.py", "tests/test_ascii.py"]},
]


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def diff_after(folder: Path, changes: dict) -> str:
    """The `git diff` that turns the checked-out tree into one with `changes` applied; the tree is restored."""
    for name, change in changes.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        before = path.read_text() if path.exists() else ""
        after = change(before)
        assert after != before, f"{name}: the change changes nothing"
        path.write_text(after)
    git(folder, "add", "-A")
    patch = git(folder, "diff", "--cached", "--no-color", "--no-ext-diff")
    git(folder, "reset", "-q", "--hard")
    return patch


def oracle_text(issue: str, files: dict[str, str]) -> str:
    """SWE-bench's `text` column (the oracle-retrieval prompt): the issue, the code of the files the fix
    touches, and how to answer."""
    code = "".join(f"[start of {name}]\n" + "".join(f"{i} {line}\n" for i, line in enumerate(text.splitlines(), 1))
                   + f"[end of {name}]\n" for name, text in files.items())
    return ("You will be provided with a partial code base and an issue statement explaining a problem to resolve.\n"
            f"<issue>\n{issue}\n</issue>\n<code>\n{code}</code>\n"
            "I need you to solve this issue by generating a single patch file that I can apply directly to this "
            "repository using git apply. Please respond with a single patch file in the format shown below.\n"
            "<patch>\n--- a/path/to/file.py\n+++ b/path/to/file.py\n@@ -1,3 +1,3 @@\n-old line\n+new line\n</patch>\n")


def main() -> None:
    shutil.rmtree(OUT / "repos", ignore_errors=True)
    (OUT / "repos").mkdir(parents=True)
    base = {}
    with tempfile.TemporaryDirectory() as scratch:
        folders = {}
        for repo, files in REPOS.items():
            folder = Path(scratch) / repo.replace("/", "__")
            folder.mkdir()
            git(folder, "init", "-q", "-b", "main")
            write(folder, files)
            git(folder, "add", "-A")
            git(folder, "commit", "-q", "-m", f"{repo}: the state the tasks start from")
            base[repo] = git(folder, "rev-parse", "HEAD").strip()
            git(folder, "bundle", "create", "-q", str((OUT / "repos" / f"{folder.name}.bundle").resolve()), "--all")
            folders[repo] = folder
        bench, pro = [], []
        for task in TASKS + PRO_TASKS:
            folder = folders[task["repo"]]
            owner, name = task["repo"].split("/")
            instance_id = f"{owner}__{name}-{task['id']}"
            patch, test_patch = diff_after(folder, task["fix"]), diff_after(folder, task["tests"])
            if task in TASKS:
                touched = {n: (folder / n).read_text() for n in task["fix"] if (folder / n).exists()}
                bench.append({"repo": task["repo"], "instance_id": instance_id, "base_commit": base[task["repo"]],
                              "patch": patch, "test_patch": test_patch, "problem_statement": task["issue"],
                              "hints_text": "", "created_at": "2026-01-05T12:00:00Z", "version": "0.1",
                              "FAIL_TO_PASS": json.dumps(task["f2p"]), "PASS_TO_PASS": json.dumps(task["p2p"]),
                              "environment_setup_commit": base[task["repo"]],
                              "text": oracle_text(task["issue"], touched)})
            else:
                pro.append({"repo": task["repo"], "instance_id": f"instance_{instance_id}",
                            "base_commit": base[task["repo"]], "patch": patch, "test_patch": test_patch,
                            "problem_statement": task["issue"], "requirements": task["requirements"],
                            "interface": task["interface"], "repo_language": "python",
                            "fail_to_pass": json.dumps(task["f2p"]), "pass_to_pass": json.dumps(task["p2p"]),
                            "issue_specificity": "[]", "issue_categories": "[]",
                            "before_repo_set_cmd": f"git reset --hard {base[task['repo']]}\ngit clean -fd\n"
                                                   f"git checkout {base[task['repo']]}",
                            "selected_test_files_to_run": json.dumps(task["run"])})
    (OUT / "swe_bench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in bench))
    (OUT / "swe_pro.jsonl").write_text("".join(json.dumps(row) + "\n" for row in pro))
    write_run_scripts([row["instance_id"] for row in pro])
    print(f"wrote {len(bench)} SWE-bench and {len(pro)} SWE-bench Pro tasks to {OUT}")


def write_run_scripts(instance_ids: list[str]) -> None:
    """SWE-bench Pro's run_scripts/<instance_id>/ (run_script.sh, parser.py) for each Pro row, from
    tools/swe_pro_scripts/ (written in the published scripts' form)."""
    for instance_id in instance_ids:
        folder = OUT / "run_scripts" / instance_id
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("run_script.sh", "parser.py"):
            shutil.copyfile(Path(__file__).parent / "swe_pro_scripts" / name, folder / name)


if __name__ == "__main__":
    main()
