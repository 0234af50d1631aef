"""OSWorld's metrics, with the semantics its evaluators define (desktop_env/evaluators/metrics), written
here: the `desktop-env` package pins torch 2.5 and a VM stack, so it cannot be installed beside
dockyard. Each takes what the getters gave (a string, a host path to a copied file, parsed rules) and
returns a score in [0, 1]; a missing result (None: the file was not there, the command failed) scores 0.

Names and arguments follow OSWorld's: `metric(result, expected, **options)`, where `expected` is the
expected getter's value (for `rule`, its `rules` object).
"""

from __future__ import annotations

import csv
import difflib
import functools
import json
import operator
import re
from pathlib import Path


def _text(path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except (OSError, TypeError):
        return None


def check_include_exclude(result, rules, **_) -> float:
    if result is None:
        return 0.0
    return float(all(word in result for word in rules.get("include", []))
                 and all(word not in result for word in rules.get("exclude", [])))


def exact_match(result, rules, **_) -> float:
    return float(result == rules["expected"])


def match_in_list(result, rules, **_) -> float:
    return float(result in rules["expected"])


def is_in_list(result, rules, **_) -> float:
    return float(result is not None and rules["expected"] in result)


def literal_match(result, expected, **options) -> float:
    kind, fold = options.get("type", "str"), options.get("ignore_case", False)
    if kind == "str":
        left, right = str(result), str(expected)
        return float(left.lower() == right.lower() if fold else left == right)
    if kind == "list":
        if not isinstance(result, (list, tuple)) or not isinstance(expected, (list, tuple)) \
                or len(result) != len(expected):
            return 0.0
        norm = (lambda s: str(s).lower()) if fold else str
        return float([norm(s) for s in result] == [norm(s) for s in expected])
    raise ValueError(f"literal_match: options.type {kind!r} is not str or list")


def fuzzy_match(result, rules, **_) -> float:
    from rapidfuzz import fuzz

    return 0.0 if result is None else fuzz.ratio(result, rules["expected"]) / 100.0


def diff_text_file(result, expected, **_) -> float:
    got, want = _text(result), _text(expected)
    if got is None or want is None:
        return 0.0
    return difflib.SequenceMatcher(a=got.splitlines(), b=want.splitlines()).ratio()


def compare_text_file(result, expected, **options) -> float:
    got, want = _text(result), _text(expected)
    if got is None or want is None:
        return 0.0
    if options.get("ignore_blanks", False):
        got, want = re.sub(r"[\t\n]", " ", got).strip(), re.sub(r"[\t\n]", " ", want).strip()
        got, want = re.sub(r"\s+", " ", got), re.sub(r"\s+", " ", want)
    if options.get("ignore_case", False):
        got, want = got.lower(), want.lower()
    return float(got == want)


def _match_record(pattern: dict, record: dict) -> bool:
    return all(key in record and record[key] == value for key, value in pattern.items())


def check_csv(result, rules, **_) -> float:
    text = _text(result)
    if text is None:
        return 0.0
    expect, unexpect = rules.get("expect", []), rules.get("unexpect", [])
    found = [False] * len(expect)
    clean = True
    for record in csv.DictReader(text.splitlines()):
        found = [seen or _match_record(pattern, record) for seen, pattern in zip(found, expect)]
        clean = clean and not any(_match_record(pattern, record) for pattern in unexpect)
    return float(all(found) and clean)


def check_list(result, rules, **_) -> float:
    text = _text(result)
    if text is None:
        return 0.0
    expect = [re.compile(p) for p in rules.get("expect", [])]
    unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    found = [False] * len(expect)
    clean = True
    for line in text.splitlines(keepends=True):
        found = [seen or pattern.search(line) is not None for seen, pattern in zip(found, expect)]
        clean = clean and all(pattern.search(line) is None for pattern in unexpect)
    return float(all(found) and clean)


def match_value_to_rule(value, rule: dict) -> bool:
    """OSWorld's {method, ref} rule: eq / ne / lt / le / gt / ge, re[.FLAG...] (a search), approx:THRESHOLD,
    str_list_eq / str_set_eq (a comma-separated string against a list)."""
    method, ref = rule["method"], rule.get("ref")
    if method.startswith("re"):
        flags = functools.reduce(operator.or_, (getattr(re, flag) for flag in method.split(".")[1:]), re.RegexFlag(0))
        return re.search(ref, "" if value is None else str(value), flags) is not None
    if method in ("eq", "ne", "le", "lt", "ge", "gt"):
        try:
            return getattr(operator, method)(value, ref)
        except TypeError:
            return False
    if method.startswith("approx:"):
        try:
            return abs(float(value) - float(ref)) <= float(method.split(":", 1)[1])
        except (TypeError, ValueError):
            return False
    if method in ("str_list_eq", "str_set_eq"):
        items = [item.strip() for item in str(value).split(",")] if value is not None else []
        return items == list(ref) if method == "str_list_eq" else set(items) == set(ref)
    raise ValueError(f"rule method {method!r} is not supported")


def check_json(result, rules, is_yaml: bool = False, **_) -> float:
    text = _text(result)
    if text is None:
        return 0.0
    try:
        if is_yaml:
            import yaml
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ValueError:
        return 0.0
    score = True
    for rule in rules.get("expect", []):
        value = data
        for key in rule["key"]:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                return 0.0
        score = score and match_value_to_rule(value, rule)
    for rule in rules.get("unexpect", []):
        value = data
        for key in rule["key"]:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                value = None
                break
        score = score and not match_value_to_rule(value, rule)
    return float(score)


def check_direct_json_object(result, rules, **_) -> float:
    if isinstance(result, str):
        try:
            result = json.loads(result.strip().replace("'", '"'))
        except ValueError:
            return 0.0
    if not isinstance(result, dict):
        return 0.0
    if rules.get("expect_in_result", False):
        for key, want in rules["expected"].items():
            got = result.get(key)
            if isinstance(want, list):
                if not any(str(item) in str(got) for item in want):
                    return 0.0
            elif str(want) not in str(got):
                return 0.0
        return 1.0
    expected = rules["expected"]
    for key, want in expected.items():
        if key == "ignore_list_order":
            continue
        got = result.get(key)
        if expected.get("ignore_list_order") and isinstance(want, list) and isinstance(got, list):
            want, got = sorted(want), sorted(got)
        if got != want:
            return 0.0
    return 1.0


def check_moved_jpgs(result, rules, **_) -> float:
    """The folder (a list_directory tree) holds exactly the expected files, by name."""
    if not isinstance(result, dict):
        return 0.0
    names = [child["name"] for child in result.get("children", [])]
    return float(len(names) == len(rules["expected"]) and set(names) == set(rules["expected"]))


A11Y_NAMESPACES = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
}


def check_accessibility_tree(result, rules, osname: str = "ubuntu", **_) -> float:
    """Each rule selects elements (`xpath`, or CSS `selectors`); with `text`, one of them must carry it
    (exactly, or by fuzzy ratio when `exact` is false); the scores multiply."""
    import lxml.etree
    from rapidfuzz import fuzz

    if result is None:
        return 0.0
    if osname != "ubuntu":
        raise ValueError(f"check_accessibility_tree: osname {osname!r}: only ubuntu trees are made here")
    tree = lxml.etree.fromstring(result.encode() if isinstance(result, str) else result)
    total = 1.0
    for rule in rules if isinstance(rules, list) else [rules]:
        if "xpath" in rule:
            elements = tree.xpath(rule["xpath"], namespaces=A11Y_NAMESPACES)
        elif "selectors" in rule:
            from lxml.cssselect import CSSSelector
            elements = CSSSelector(", ".join(rule["selectors"]), namespaces=A11Y_NAMESPACES)(tree)
        else:
            raise ValueError("check_accessibility_tree: a rule needs xpath or selectors")
        if not elements:
            return 0.0
        if "text" in rule:
            exact = rule.get("exact", True)
            best = 0.0
            for element in elements:
                text = element.text or ""
                best = max(best, float(text == rule["text"]) if exact else fuzz.ratio(text, rule["text"]) / 100.0)
            total *= best
    return float(total)


METRICS = {name: globals()[name] for name in (
    "check_include_exclude", "exact_match", "match_in_list", "is_in_list", "literal_match", "fuzzy_match",
    "diff_text_file", "compare_text_file", "check_csv", "check_list", "check_json", "check_direct_json_object",
    "check_accessibility_tree", "check_moved_jpgs")}
