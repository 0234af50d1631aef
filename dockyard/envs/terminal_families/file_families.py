"""Families of file-system work: finding, archiving, renaming, permissions and links."""

from __future__ import annotations

import random

from dockyard.envs.terminal_families.core import WORDS, Family, TaskInstance, distinct, file_name, text_lines


def _tree(rng: random.Random, root: str) -> dict[str, str]:
    """A small folder tree of .log, .txt and .csv files with contents of varied sizes."""
    files = {}
    for sub in ["", *distinct(rng, 2)]:
        for name in distinct(rng, rng.randint(2, 4)):
            suffix = rng.choice((".log", ".txt", ".csv"))
            files[f"{root}/{sub + '/' if sub else ''}{name}{suffix}"] = "\n".join(text_lines(rng, rng.randint(1, 30))) + "\n"
    files[f"{root}/{rng.choice(WORDS)}-extra.log"] = "started\n"
    return files


class FindFiles(Family):
    name, category = "find_files", "file-operations"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        root, out = "data", file_name(rng, "_found.txt")
        files = _tree(rng, root)
        if level == 1:
            found = sorted(path for path in files if path.endswith(".log"))
            return self.task(level, f"List every .log file under the folder {root} (at any depth) as its path "
                             f"starting with {root}/, one per line, sorted, in {out}.", files,
                             f"find {root} -type f -name '*.log' | LC_ALL=C sort > {out}",
                             f"def test_found():\n    assert (APP / {out!r}).read_text().split() == {found!r}")
        if level == 2:
            limit = sorted(len(text.encode()) for text in files.values())[len(files) // 2]
            found = sorted(path for path, text in files.items() if len(text.encode()) > limit)
            return self.task(level, f"List every file under the folder {root} (at any depth) that is larger than "
                             f"{limit} bytes as its path starting with {root}/, one per line, sorted, in {out}.", files,
                             f"find {root} -type f -size +{limit}c | LC_ALL=C sort > {out}",
                             f"def test_found():\n    assert (APP / {out!r}).read_text().split() == {found!r}")
        archive = "logs.tar.gz"
        logs = {path: text for path, text in files.items() if path.endswith(".log")}
        return self.task(level, f"Put every .log file under the folder {root} (at any depth) into a gzip-compressed tar "
                         f"archive {archive}, with their paths starting with {root}/ inside it, and nothing else.",
                         files, f"find {root} -type f -name '*.log' | tar -czf {archive} -T -",
                         f"import tarfile\n\nEXPECTED = {logs!r}\n\n\ndef test_archive():\n"
                         f"    with tarfile.open(APP / {archive!r}, 'r:gz') as tar:\n"
                         "        members = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}\n"
                         "    assert members == EXPECTED")


class RenameFiles(Family):
    name, category = "rename_files", "file-operations"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        folder = "inbox"
        names = distinct(rng, rng.randint(3, 6))
        if level == 1:
            files = {f"{folder}/{n}.txt": f"{n}\n" for n in names}
            expected = {f"{folder}/{n}.md": f"{n}\n" for n in names}
            instruction = f"Rename every .txt file in the folder {folder} to the same name with the extension .md."
            solution = f"cd {folder} && for f in *.txt; do mv \"$f\" \"${{f%.txt}}.md\"; done"
        elif level == 2:
            prefix = f"{rng.randint(2020, 2029)}"
            files = {f"{folder}/{n}.txt": f"{n}\n" for n in names}
            expected = {f"{folder}/{prefix}_{n}.txt": f"{n}\n" for n in names}
            instruction = f"Add the prefix {prefix}_ to the name of every file in the folder {folder}."
            solution = f"cd {folder} && for f in *; do mv \"$f\" \"{prefix}_$f\"; done"
        else:
            upper = [n.upper() if i % 2 == 0 else n.capitalize() for i, n in enumerate(names)]
            files = {f"{folder}/{n}.TXT": f"{n}\n" for n in upper}
            expected = {f"{folder}/{n.lower()}.txt": f"{n}\n" for n in upper}
            instruction = f"Rename every file in the folder {folder} to its name in lower case (extension included)."
            solution = (f"cd {folder} && for f in *; do l=$(printf '%s' \"$f\" | tr 'A-Z' 'a-z'); "
                        "[ \"$f\" = \"$l\" ] || mv \"$f\" \"$l\"; done")
        return self.task(level, instruction, files, solution,
                         f"EXPECTED = {expected!r}\n\n\ndef test_renamed():\n"
                         f"    found = {{str(p.relative_to(APP)): p.read_text() for p in (APP / {folder!r}).iterdir()}}\n"
                         "    assert found == EXPECTED")


class Permissions(Family):
    name, category = "permissions", "file-operations"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        if level == 1:
            script, word = file_name(rng, ".sh"), rng.choice(WORDS)
            return self.task(level, f"Make {script} executable (by its owner at least), so that ./{script} runs.",
                             {script: f"#!/bin/bash\necho {word}\n"}, f"chmod +x {script}",
                             f"import os\n\n\ndef test_executable():\n    assert os.access(APP / {script!r}, os.X_OK)\n"
                             f"    assert subprocess.run([str(APP / {script!r})], capture_output=True, text=True)"
                             f".stdout.strip() == {word!r}")
        if level == 2:
            secret, public = file_name(rng, ".key"), file_name(rng, ".pub")
            return self.task(level, f"Make {secret} readable and writable by its owner only (mode 600); leave "
                             f"{public} as it is.", {secret: f"{rng.getrandbits(64):016x}\n",
                                                     public: f"{rng.choice(WORDS)}\n"}, f"chmod 600 {secret}",
                             f"import stat\n\n\ndef test_mode():\n    assert stat.S_IMODE((APP / {secret!r}).stat().st_mode) == 0o600\n"
                             f"    assert (APP / {public!r}).stat().st_mode & 0o004  # still readable by others")
        days = sorted(rng.sample(range(1, 29), rng.randint(3, 6)))
        month = rng.randint(1, 9)
        reports = {f"reports/report-2026-0{month}-{d:02d}.txt": f"day {d}\n" for d in days}
        newest = f"report-2026-0{month}-{days[-1]:02d}.txt"
        return self.task(level, "The folder reports holds report-YYYY-MM-DD.txt files. Create a symbolic link "
                         "reports/latest that points to the newest of them by the date in its name (a relative link, "
                         "to the file name alone).", reports,
                         "cd reports && ln -s \"$(ls report-*.txt | sort | tail -n 1)\" latest",
                         f"import os\n\n\ndef test_link():\n    link = APP / 'reports' / 'latest'\n"
                         f"    assert link.is_symlink() and os.readlink(link) == {newest!r}\n"
                         f"    assert link.read_text() == {reports['reports/' + newest]!r}")
