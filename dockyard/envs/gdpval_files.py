"""GDPval deliverables: reading a produced file (md, txt, csv, json, html, xlsx, docx) and grading it
with a task's rubric: checks on the file, each worth points; the reward is the share of the points
earned.

A rubric (the row's rubric column, a JSON object or its text):
    {"deliverable": "summary.csv", "checks": [{"check": "csv_columns", "columns": ["region", "total"],
      "points": 1}, ...]}
Checks (points default to 1):
    contains / not_contains   text (case-insensitive) in the file's text
    regex                     pattern (Python re, multiline) found in the file's text
    min_words / max_words     limit: the file's word count
    headings                  headings: each is a heading of the document (markdown `#` lines, docx
                              Heading styles), case-insensitive
    columns                   columns: the table's header holds each (csv, xlsx; sheet optional)
    row_count                 equals / min / max: the table's data rows
    cell                      where {column: value} picks the row, column names the cell, equals the
                              value (numbers compared within tolerance, default 0.01; text case-insensitive)
    sheets                    names: the workbook has these sheets (xlsx)
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from dockyard.errors import DockyardError

TEXT_FORMATS = ("md", "txt", "csv", "json", "html")
BINARY_FORMATS = ("xlsx", "docx")
MAX_BYTES = 5 * 1024 * 1024
CHECKS = ("contains", "not_contains", "regex", "min_words", "max_words", "headings", "columns", "row_count",
          "cell", "sheets")


class RubricError(DockyardError, ValueError):
    """A rubric that cannot be used; the message names the check."""


def read_rubric(value) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RubricError(f"the rubric is not JSON ({err.msg})") from None
    if not isinstance(value, dict) or not isinstance(value.get("deliverable"), str) or not value["deliverable"]:
        raise RubricError("the rubric needs a deliverable file name")
    deliverable = value["deliverable"]
    if "/" in deliverable or deliverable.startswith("."):
        raise RubricError(f"deliverable {deliverable!r} must be a plain file name")
    if suffix(deliverable) not in TEXT_FORMATS + BINARY_FORMATS:
        raise RubricError(f"deliverable {deliverable!r}: format not one of {', '.join(TEXT_FORMATS + BINARY_FORMATS)}")
    checks = value.get("checks")
    if not isinstance(checks, list) or not checks:
        raise RubricError("the rubric has no checks")
    for index, check in enumerate(checks):
        if not isinstance(check, dict) or check.get("check") not in CHECKS:
            raise RubricError(f"check {index}: `check` must be one of {', '.join(CHECKS)}")
        points = check.get("points", 1)
        if not isinstance(points, (int, float)) or points <= 0:
            raise RubricError(f"check {index}: points must be a positive number")
    return value


def suffix(name: str) -> str:
    return Path(name).suffix.lstrip(".").lower()


class Deliverable:
    """A produced file as text and, for csv / xlsx, tables (sheet name -> header, rows)."""

    def __init__(self, path: Path):
        self.format = suffix(path.name)
        if path.stat().st_size > MAX_BYTES:
            raise ValueError(f"{path.name} is larger than {MAX_BYTES // (1024 * 1024)} MiB")
        self.headings: list[str] = []
        self.tables: dict[str, tuple[list[str], list[list]]] = {}
        if self.format == "xlsx":
            self._read_xlsx(path)
        elif self.format == "docx":
            self._read_docx(path)
        else:
            self.text = path.read_text(encoding="utf-8", errors="replace")
            if self.format == "csv":
                rows = list(csv.reader(io.StringIO(self.text)))
                self.tables[""] = ([c.strip() for c in rows[0]] if rows else [], [r for r in rows[1:] if any(r)])
            if self.format == "md":
                self.headings = [line.lstrip("#").strip() for line in self.text.splitlines() if line.startswith("#")]

    def _read_xlsx(self, path: Path) -> None:
        import openpyxl

        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
        texts = []
        for sheet in book.worksheets:
            rows = [list(row) for row in sheet.iter_rows(values_only=True)]
            rows = [r for r in rows if any(v is not None for v in r)]
            header = [str(v).strip() if v is not None else "" for v in rows[0]] if rows else []
            self.tables[sheet.title] = (header, rows[1:])
            texts += ["\t".join("" if v is None else str(v) for v in r) for r in rows]
        self.text = "\n".join(texts)

    def _read_docx(self, path: Path) -> None:
        import docx

        document = docx.Document(str(path))
        lines = []
        for paragraph in document.paragraphs:
            lines.append(paragraph.text)
            if paragraph.style is not None and paragraph.style.name.lower().startswith(("heading", "title")):
                self.headings.append(paragraph.text.strip())
        for table in document.tables:
            lines += ["\t".join(cell.text for cell in row.cells) for row in table.rows]
        self.text = "\n".join(lines)

    def table(self, sheet: str | None) -> tuple[list[str], list[list]]:
        if not self.tables:
            raise ValueError(f"a {self.format} file has no table")
        if sheet is None:
            return next(iter(self.tables.values()))
        if sheet not in self.tables:
            raise ValueError(f"no sheet {sheet!r} (sheets: {', '.join(self.tables)})")
        return self.tables[sheet]


def _same(got, want, tolerance: float) -> bool:
    try:
        return abs(float(str(got).replace(",", "").strip()) - float(want)) <= tolerance
    except (TypeError, ValueError):
        return str(got).strip().lower() == str(want).strip().lower()


def _column(header: list[str], name: str) -> int:
    lowered = [h.lower() for h in header]
    if name.lower() not in lowered:
        raise ValueError(f"no column {name!r}")
    return lowered.index(name.lower())


def run_check(check: dict, file: Deliverable) -> tuple[bool, str]:
    kind, text = check["check"], file.text
    if kind in ("contains", "not_contains"):
        found = str(check["text"]).lower() in text.lower()
        return (found if kind == "contains" else not found), f"{kind} {check['text']!r}"
    if kind == "regex":
        return re.search(check["pattern"], text, re.MULTILINE) is not None, f"matches {check['pattern']!r}"
    if kind in ("min_words", "max_words"):
        words = len(text.split())
        ok = words >= check["limit"] if kind == "min_words" else words <= check["limit"]
        return ok, f"{words} words ({kind} {check['limit']})"
    if kind == "headings":
        have = {h.lower() for h in file.headings}
        missing = [h for h in check["headings"] if h.lower() not in have]
        return not missing, "headings" + (f" missing {missing}" if missing else "")
    if kind == "sheets":
        missing = [n for n in check["names"] if n not in file.tables]
        return not missing, "sheets" + (f" missing {missing}" if missing else "")
    header, rows = file.table(check.get("sheet"))
    if kind == "columns":
        missing = [c for c in check["columns"] if c.lower() not in [h.lower() for h in header]]
        return not missing, "columns" + (f" missing {missing}" if missing else "")
    if kind == "row_count":
        count = len(rows)
        ok = (count == check["equals"]) if "equals" in check else \
            check.get("min", 0) <= count <= check.get("max", float("inf"))
        return ok, f"{count} rows"
    if kind == "cell":
        (key, value), = check["where"].items()
        index, target = _column(header, key), _column(header, check["column"])
        matches = [r for r in rows if index < len(r) and _same(r[index], value, 0)]
        if not matches:
            return False, f"no row where {key} = {value!r}"
        got = matches[0][target] if target < len(matches[0]) else None
        return _same(got, check["equals"], check.get("tolerance", 0.01)), f"{check['column']} where {key}={value!r}: {got!r}"
    raise ValueError(f"unknown check {kind!r}")


def grade(rubric: dict, path: Path | None) -> tuple[float, list[str]]:
    """The share of the rubric's points the file earns, and one line per check."""
    total = sum(c.get("points", 1) for c in rubric["checks"])
    if path is None or not path.is_file():
        return 0.0, [f"no deliverable {rubric['deliverable']}"]
    try:
        file = Deliverable(path)
    except Exception as err:   # an unreadable produced file earns nothing; the run goes on
        return 0.0, [f"{rubric['deliverable']} cannot be read: {type(err).__name__}: {err}"]
    earned, lines = 0.0, []
    for check in rubric["checks"]:
        try:
            ok, what = run_check(check, file)
        except (ValueError, KeyError, TypeError, re.error) as err:
            ok, what = False, f"{check['check']}: {err}"
        earned += check.get("points", 1) if ok else 0
        lines.append(f"{'pass' if ok else 'FAIL'} {what}")
    return earned / total, lines
