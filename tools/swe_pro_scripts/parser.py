"""A SWE-bench Pro parser (run_scripts/<instance_id>/parser.py), in the published parsers' form: reads
pytest -v output into output.json. Usage: python parser.py stdout.log stderr.log output.json"""
import dataclasses
import json
import re
import sys
from enum import Enum
from pathlib import Path
from typing import List


class TestStatus(Enum):
    PASSED = 1
    FAILED = 2
    SKIPPED = 3
    ERROR = 4


@dataclasses.dataclass
class TestResult:
    name: str
    status: TestStatus


LINE = re.compile(r"^(\S+\.py::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR)\b")


def parse_test_output(stdout_content: str, stderr_content: str) -> List[TestResult]:
    results = {}
    for line in stdout_content.splitlines():
        match = LINE.match(line.strip())
        if match:
            results[match.group(1)] = TestResult(match.group(1), TestStatus[match.group(2)])
    return list(results.values())


def export_to_json(results: List[TestResult], output_path: Path) -> None:
    data = {"tests": [{"name": r.name, "status": r.status.name} for r in results]}
    output_path.write_text(json.dumps(data, indent=2))


def main(stdout_path: Path, stderr_path: Path, output_path: Path) -> None:
    results = parse_test_output(stdout_path.read_text(errors="replace"), stderr_path.read_text(errors="replace"))
    export_to_json(results, output_path)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print("usage: python parser.py <stdout_file> <stderr_file> <output_json>")
        sys.exit(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
