"""Families of line and text work: counting, sorting, replacing, summarising a log."""

from __future__ import annotations

import random
from collections import Counter

from dockyard.envs.terminal_families.core import WORDS, Family, TaskInstance, distinct, file_name, text_lines, words


class CountLines(Family):
    name, category = "count_lines", "text-processing"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        out = file_name(rng, "_count.txt")
        if level == 1:
            source, lines = file_name(rng, ".txt"), text_lines(rng, rng.randint(5, 40))
            return self.task(level, f"Count the lines of {source} and write the number (digits only) to {out}.",
                             {source: "\n".join(lines) + "\n"}, f"wc -l < {source} | tr -d ' ' > {out}",
                             f"def test_count():\n    assert (APP / {out!r}).read_text().strip() == {str(len(lines))!r}")
        word = rng.choice(WORDS)
        if level == 2:
            source, lines = file_name(rng, ".txt"), text_lines(rng, rng.randint(10, 40))
            lines[rng.randrange(len(lines))] += f" {word}"   # at least one
            count = sum(word in line.split() for line in lines)
            return self.task(level, f"Count the lines of {source} that contain the word {word} and write the number "
                             f"(digits only) to {out}.", {source: "\n".join(lines) + "\n"},
                             f"grep -cw {word} {source} > {out}",
                             f"def test_count():\n    assert (APP / {out!r}).read_text().strip() == {str(count)!r}")
        folder, files, count = "notes", {}, 0
        for name in distinct(rng, rng.randint(2, 4)):
            lines = text_lines(rng, rng.randint(4, 15))
            lines[0] += f" {word}"
            count += sum(word in line.split() for line in lines)
            files[f"{folder}/{name}.txt"] = "\n".join(lines) + "\n"
        files[f"{folder}/{rng.choice(WORDS)}.md"] = f"{word} {word}\n"   # not a .txt file: not counted
        return self.task(level, f"Count the lines that contain the word {word} in all the .txt files of the folder "
                         f"{folder} together and write the total (digits only) to {out}.", files,
                         f"cat {folder}/*.txt | grep -cw {word} > {out}",
                         f"def test_count():\n    assert (APP / {out!r}).read_text().strip() == {str(count)!r}")


class SortUnique(Family):
    name, category = "sort_unique", "text-processing"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        source, out = file_name(rng, ".txt"), file_name(rng, "_sorted.txt")
        if level == 1:
            lines = distinct(rng, rng.randint(5, 15))
            return self.task(level, f"Write the lines of {source} sorted alphabetically to {out}.",
                             {source: "\n".join(lines) + "\n"}, f"LC_ALL=C sort {source} > {out}",
                             f"def test_sorted():\n    assert (APP / {out!r}).read_text().split('\\n')[:-1] == "
                             f"{sorted(lines)!r}")
        if level == 2:
            lines = words(rng, rng.randint(10, 30), distinct(rng, 8))
            return self.task(level, f"Write each distinct line of {source} once, sorted alphabetically, to {out}.",
                             {source: "\n".join(lines) + "\n"}, f"LC_ALL=C sort -u {source} > {out}",
                             f"def test_unique():\n    assert (APP / {out!r}).read_text().split('\\n')[:-1] == "
                             f"{sorted(set(lines))!r}")
        top = rng.randint(2, 4)
        pool = distinct(rng, top + 3)
        counts = rng.sample(range(2, 20), len(pool))      # distinct counts: no ties in the ranking
        lines = [w for w, c in zip(pool, counts) for _ in range(c)]
        rng.shuffle(lines)
        ranked = [w for w, _ in Counter(lines).most_common(top)]
        return self.task(level, f"{source} has one word per line. Write the {top} most frequent words, most frequent "
                         f"first, one per line, to {out}.", {source: "\n".join(lines) + "\n"},
                         f"sort {source} | uniq -c | sort -rn | head -n {top} | awk '{{print $2}}' > {out}",
                         f"def test_top():\n    assert (APP / {out!r}).read_text().split() == {ranked!r}")


class ReplaceText(Family):
    name, category = "replace_text", "text-processing"

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        old, new = distinct(rng, 2)
        body = lambda: "\n".join(line + f" {old}" if rng.random() < 0.5 else line   # noqa: E731
                                  for line in text_lines(rng, rng.randint(4, 10))) + f"\n{old}\n"
        if level == 1:
            source = file_name(rng, ".txt")
            files = {source: body()}
            changed = {source: files[source].replace(old, new)}
            solution, what = f"sed -i 's/{old}/{new}/g' {source}", f"in {source}"
        else:
            folder = "docs"
            files = {f"{folder}/{name}.txt": body() for name in distinct(rng, 3)}
            changed = {path: text.replace(old, new) for path, text in files.items()}
            solution, what = f"sed -i 's/{old}/{new}/g' {folder}/*.txt", f"in every .txt file of the folder {folder}"
            if level == 3:
                kept = f"{folder}/{rng.choice(WORDS)}.md"
                files[kept] = changed[kept] = f"{old} stays here\n"
                what += " (leave the other files as they are)"
        return self.task(level, f"Replace every occurrence of the word {old} with {new} {what}.", files, solution,
                         f"EXPECTED = {changed!r}\n\n\ndef test_replaced():\n    for path, text in EXPECTED.items():\n"
                         "        assert (APP / path).read_text() == text, path")


class LogSummary(Family):
    name, category = "log_summary", "log-analysis"
    LEVELS = ("DEBUG", "ERROR", "INFO", "WARN")

    def _log(self, rng: random.Random) -> list[tuple[int, str, str]]:
        rows = [(rng.randint(0, 23), rng.choice(self.LEVELS), " ".join(words(rng, 3))) for _ in range(rng.randint(15, 40))]
        rows.append((rng.randint(0, 23), "ERROR", "disk full"))
        return sorted(rows, key=lambda r: r[0])

    def make(self, rng: random.Random, level: int) -> TaskInstance:
        rows = self._log(rng)
        source, out = file_name(rng, ".log"), file_name(rng, "_summary.txt")
        log = "".join(f"2026-03-0{1 + hour % 9}T{hour:02d}:{rng.randint(0, 59):02d}:00 {lvl} {msg}\n"
                      for hour, lvl, msg in rows)
        if level == 1:
            count = sum(lvl == "ERROR" for _, lvl, _ in rows)
            return self.task(level, f"Count the ERROR lines of {source} and write the number (digits only) to {out}.",
                             {source: log}, f"grep -c ' ERROR ' {source} > {out}",
                             f"def test_count():\n    assert (APP / {out!r}).read_text().strip() == {str(count)!r}")
        if level == 2:
            counts = Counter(lvl for _, lvl, _ in rows)
            expected = [f"{lvl} {counts[lvl]}" for lvl in sorted(counts)]
            return self.task(level, f"Each line of {source} is: timestamp, level, message. Write one line per level "
                             f"that occurs, as 'LEVEL COUNT', sorted by level name, to {out}.", {source: log},
                             f"awk '{{print $2}}' {source} | LC_ALL=C sort | uniq -c | awk '{{print $2, $1}}' > {out}",
                             f"def test_summary():\n    assert (APP / {out!r}).read_text().strip().split('\\n') == {expected!r}")
        counts = Counter(hour for hour, lvl, _ in rows if lvl == "ERROR")
        expected = [f"{hour:02d} {counts[hour]}" for hour in sorted(counts)]
        return self.task(level, f"Each line of {source} starts with an ISO timestamp (YYYY-MM-DDTHH:MM:SS) then the "
                         f"level. For every hour that has ERROR lines, write 'HH COUNT' (two-digit hour), in hour order, "
                         f"to {out}.", {source: log},
                         f"grep ' ERROR ' {source} | cut -c12-13 | sort | uniq -c | awk '{{print $2, $1}}' > {out}",
                         f"def test_hours():\n    assert (APP / {out!r}).read_text().strip().split('\\n') == {expected!r}")
