"""Families of small programming chores: fixing a broken script, git."""

from __future__ import annotations

import random

from dockyard.envs.terminal_families.core import NAMES, WORDS, Family, TaskInstance, file_name, text_lines

# the sandbox has no git identity; the oracle sets one for this repository in its own short call, so
# that no demonstrated reply outgrows a turn's token budget
IDENTITY = "git init -q && git config user.name dockyard && git config user.email agent@example.com"


class FixScript(Family):
    """The oracle reads the script before it edits it: which operator or name is wrong is in the file,
    not in the instruction, and a demonstration should show where the answer came from."""

    name, category = "fix_script", "scripting"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        script = file_name(rng, ".py")
        if level == 1:
            op, name, broken = rng.choice((("+", "sum", "-"), ("*", "product", "+"), ("-", "difference", "+")))
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            apply = {"+": int.__add__, "*": int.__mul__, "-": int.__sub__}[op]
            x, y = rng.choice((("a", "b"), ("x", "y"), ("first", "second"), ("left", "right"), ("m", "n")))
            source = (f"import sys\n\n# {rng.choice(WORDS)} calculator\n{x}, {y} = int(sys.argv[1]), int(sys.argv[2])\n"
                      f"print({x} {broken} {y})\n")
            return self.task(level, f"The script {script} should print the {name} of its two arguments (python3 "
                             f"{script} {a} {b} prints {apply(a, b)}) but it has a bug. Fix {script}.", {script: source},
                             f"cat {script}\nsed -i 's/print({x} {broken} {y})/print({x} {op} {y})/' {script}",
                             f"def run(*args):\n    return subprocess.run(['python3', str(APP / {script!r}), *args], "
                             "capture_output=True, text=True).stdout.strip()\n\n\ndef test_fixed():\n"
                             f"    assert run({str(a)!r}, {str(b)!r}) == {str(apply(a, b))!r}\n"
                             f"    assert run('12', '5') == {str(apply(12, 5))!r}")
        data = file_name(rng, ".txt")
        lines = text_lines(rng, rng.randint(4, 12))
        if level == 2:
            var = rng.choice(("count", "total", "rows", "lines", "number"))
            typo = var[0] + var[2] + var[1] + var[3:]   # two letters swapped: a NameError
            source = (f"import sys\n\n# counts the {rng.choice(WORDS)} lines\n{var} = 0\nfor line in open(sys.argv[1]):\n"
                      f"    if line.strip():\n        {var} += 1\nprint({typo})\n")
            return self.task(level, f"The script {script} should print how many non-empty lines the file given as "
                             f"its argument has (python3 {script} {data}), but it fails. Fix {script}.",
                             {script: source, data: "\n".join(lines) + "\n\n"},
                             f"cat {script}\nsed -i 's/print({typo})/print({var})/' {script}",
                             f"def test_fixed(tmp_path):\n    other = tmp_path / 'other.txt'\n    other.write_text('a\\n\\nb\\nc\\n')\n"
                             f"    run = lambda path: subprocess.run(['python3', str(APP / {script!r}), str(path)], "
                             "capture_output=True, text=True).stdout.strip()\n"
                             f"    assert run(APP / {data!r}) == {str(len(lines))!r} and run(other) == '3'")
        count = rng.randint(3, 9)
        what, power = rng.choice((("squares", 2), ("cubes", 3)))
        var = rng.choice(("i", "k", "j", "step"))
        source = f"import sys\n\n# {rng.choice(WORDS)}\nn = int(sys.argv[1])\nfor {var} in range(1, n):\n    print({var} ** {power})\n"
        return self.task(level, f"The script {script} should print the {what} of 1 to N, one per line, for the N "
                         f"given as its argument (python3 {script} {count} prints {count} lines, the last "
                         f"{count ** power}). It prints one line too few. Fix {script}.", {script: source},
                         f"cat {script}\nsed -i 's/range(1, n)/range(1, n + 1)/' {script}",
                         f"def run(n):\n    return subprocess.run(['python3', str(APP / {script!r}), n], capture_output=True, "
                         "text=True).stdout.split()\n\n\ndef test_fixed():\n"
                         f"    assert run({str(count)!r}) == {[str(i ** power) for i in range(1, count + 1)]!r}\n"
                         f"    assert run('2') == ['1', '{2 ** power}']")


class GitOps(Family):
    name, category = "git_ops", "version-control"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        first, second = file_name(rng, ".txt"), file_name(rng, "_more.txt")
        message = f"add {first.removesuffix('.txt')} notes"
        files = {first: "\n".join(text_lines(rng, 3)) + "\n", second: "\n".join(text_lines(rng, 2)) + "\n"}
        git = "def git(*args):\n    return subprocess.run(['git', '-C', str(APP), *args], capture_output=True, text=True)\n\n\n"
        if level == 1:
            return self.task(level, f"Make this folder a git repository and commit {first} (only that file) with the "
                             f"message: {message}", files,
                             f"{IDENTITY}\ngit add {first} && git commit -q -m '{message}'",
                             git + "def test_commit():\n    assert git('log', '--format=%s').stdout.strip() == "
                             f"{message!r}\n    assert git('ls-files').stdout.split() == [{first!r}]")
        branch = f"feature-{rng.choice(NAMES)}"
        if level == 2:
            return self.task(level, f"Make this folder a git repository, commit {first} with the message: {message}; "
                             f"then create a branch {branch}, switch to it and commit {second} there with the message: "
                             f"add {second}", files,
                             f"{IDENTITY}\ngit add {first} && git commit -q -m '{message}' && git checkout -q -b "
                             f"{branch} && git add {second} && git commit -q -m 'add {second}'",
                             git + "def test_branch():\n    assert git('rev-parse', '--abbrev-ref', 'HEAD').stdout.strip() == "
                             f"{branch!r}\n    assert git('log', '--format=%s').stdout.split('\\n')[:2] == "
                             f"['add {second}', {message!r}]\n    assert {second!r} in git('ls-files').stdout.split()")
        return self.task(level, f"Make this folder a git repository; commit {first} with the message: {message}; "
                         f"commit {second} with the message: add {second}; then undo that second commit with a new "
                         "revert commit (git revert), keeping the history.", files,
                         f"{IDENTITY}\ngit add {first} && git commit -q -m '{message}' && git add {second} && "
                         f"git commit -q -m 'add {second}' && git revert --no-edit HEAD",
                         git + "def test_reverted():\n    log = git('log', '--format=%s').stdout.strip().split('\\n')\n"
                         f"    assert len(log) == 3 and log[0].startswith('Revert') and log[1:] == ['add {second}', {message!r}]\n"
                         f"    assert git('ls-files').stdout.split() == [{first!r}]")
