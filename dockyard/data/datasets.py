"""Prompt datasets: rows from .jsonl / .parquet files (with `@[a:b]` row slices) or from a
reasoning-gym generator, normalised to {input, label, metadata}, filtered, and served in a seeded,
resumable order."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from dockyard import registry
from dockyard.config.schema.data import DatasetConfig
from dockyard.data.label_checks import ANSWER_CHECKS
from dockyard.errors import DockyardError

_SCAN_FACTOR = 4   # how many generated rows may be looked at per row served
_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


class DatasetError(DockyardError, ValueError):
    label = "data error"


def split_row_slice(spec: str) -> tuple[Path, slice]:
    match = _SLICE.match(spec)
    if not match:
        return Path(spec), slice(None)
    start, stop = match["start"], match["stop"]
    return Path(match["path"]), slice(int(start) if start else None, int(stop) if stop else None)


def read_rows(spec: str) -> list[dict[str, Any]]:
    path, rows_slice = split_row_slice(spec)
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    try:
        rows = _read_file(path)
    except OSError as err:   # unreadable, or deleted while being read
        raise DatasetError(f"{path}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise DatasetError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    for bound in (rows_slice.start, rows_slice.stop):
        if bound is not None and abs(bound) > len(rows):
            raise DatasetError(f"{spec}: the row slice [{_bound(rows_slice.start)}:{_bound(rows_slice.stop)}] is out of "
                               f"range: the file has {len(rows)} rows")
    return rows[rows_slice]


def _bound(value: int | None) -> str:
    return "" if value is None else str(value)


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl" or path.name.endswith(".jsonl.gz"):   # HumanEval ships gzipped
        import gzip

        rows = []
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DatasetError(f"{path}:{number}: not valid JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise DatasetError(f"{path}:{number}: each line must be a JSON object")
                rows.append(row)
        return rows
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowException, ValueError) as err:
            raise DatasetError(f"{path}: not a readable parquet file ({err})") from None
    if path.suffix == ".csv":   # GPQA's published format
        import csv

        with open(path, encoding="utf-8", newline="") as handle:
            try:
                return [dict(row) for row in csv.DictReader(handle)]
            except csv.Error as err:
                raise DatasetError(f"{path}: not a readable csv file ({err})") from None
    raise DatasetError(f"{path}: unsupported dataset format {path.suffix!r} (use .jsonl, .jsonl.gz, .parquet or .csv)")


def generate_rows(config: DatasetConfig) -> list[dict[str, Any]]:
    import reasoning_gym

    generator = config.generator
    extra = dict(generator.model_extra or {})
    check = ANSWER_CHECKS.get(generator.name)
    # rows with a wrong answer are replaced by later ones, so `size` stays the number of rows served
    scanned = generator.size * _SCAN_FACTOR if check else generator.size
    try:
        dataset = reasoning_gym.create_dataset(generator.name, size=scanned, seed=generator.seed, **extra)
    except Exception as err:
        raise DatasetError(f"data generator {generator.name!r}: {type(err).__name__}: {err}") from None
    entries, wrong = [], 0
    for index in range(scanned):
        entry = dataset[index]
        if check is not None and not check(entry):
            wrong += 1
            continue
        entries.append(entry)
        if len(entries) == generator.size:
            break
    if wrong:
        print(f"dockyard: dataset {config.name!r}: skipped {wrong} {generator.name} rows whose answer is not "
              f"the value of their question (a reasoning-gym bug); {len(entries)} rows kept",
              file=sys.stderr, flush=True)
    return [{"input": entry["question"], "label": entry["answer"],
             "metadata": {**entry["metadata"], "reasoning_gym_entry": dict(entry)}} for entry in entries]


@dataclass
class Prompt:
    input: Any          # prompt text or a message list
    label: Any
    metadata: dict[str, Any]
    source: str         # dataset name, for per-dataset metrics
    source_file: str | None = None   # the dataset's file, which rows may name files relative to


def row_path(prompt: Prompt, key: str = "path") -> Path | None:
    """The file or folder a row's metadata names under `key` (a task's), resolved against the dataset
    file's folder where relative; None when the row names none."""
    value = prompt.metadata.get(key)
    if not isinstance(value, str):
        return None
    path = Path(value)
    if not path.is_absolute() and prompt.source_file:
        path = Path(prompt.source_file).parent / path
    return path.resolve()


def index_row(instruction: str, path: Path, name: str, relative_to: Path) -> dict:
    """A task set's dataset row (`dockyard env index`): the task's path relative to the index file's folder."""
    path, base = Path(path).resolve(), Path(relative_to).resolve()
    try:
        shown = str(path.relative_to(base))
    except ValueError:
        shown = str(path)
    return {"instruction": instruction, "task": {"path": shown, "name": name}}


def load_prompts(config: DatasetConfig) -> list[Prompt]:
    """All rows of one dataset, validated and filtered; a bad row names the dataset and row."""
    if config.generator is not None:
        raw = generate_rows(config)
        keys = ("input", "label", "metadata")
    else:
        raw = read_rows(config.path)
        keys = (config.input_key, config.label_key, config.metadata_key)
    # pre-processors are plain functions of a row, so the registered function itself is used
    pre_processor = (registry.get("data_pre_processor", config.data_pre_processor).factory
                     if config.data_pre_processor else None)
    prompts = []
    for index, row in enumerate(raw):
        where = f"dataset {config.name!r} row {index}"
        if pre_processor is not None:
            try:
                row = pre_processor(row)
            except (KeyError, ValueError) as err:
                raise DatasetError(f"{where}: {config.data_pre_processor} pre-processor failed: {err}") from None
            keys = ("input", "label", keys[2])
        input_key, label_key, metadata_key = keys
        if input_key not in row:
            raise DatasetError(f"{where}: no {input_key!r} column (data.datasets[].input_key); "
                               f"columns: {', '.join(map(str, row))}")
        if label_key is not None and label_key not in row:
            raise DatasetError(f"{where}: no {label_key!r} column (label_key; set it to null if unused)")
        metadata = dict(row) if metadata_key is None else row.get(metadata_key) or {}
        if not isinstance(metadata, dict):
            raise DatasetError(f"{where}: {metadata_key!r} must be a dict, got {type(metadata).__name__}")
        text = row[input_key]
        if config.max_prompt_chars is not None and len(str(text)) > config.max_prompt_chars:
            continue
        prompts.append(Prompt(text, row.get(label_key) if label_key else None, metadata, config.name,
                              None if config.generator is not None else str(split_row_slice(config.path)[0])))
    if not prompts:
        raise DatasetError(f"dataset {config.name!r} has no rows left after filtering")
    return prompts


class PromptLoader:
    """Epochs over one dataset in a seeded order; its position is part of a checkpoint."""

    def __init__(self, prompts: list[Prompt], shuffle: bool, seed: int,
                 accept: Callable[[Prompt], bool] | None = None, name: str = ""):
        """`accept`: rows it refuses (a prompt too long to generate from) are skipped when drawn, and
        remembered, so each row is judged once and the order of the others is unchanged."""
        self.prompts, self.shuffle, self.seed, self.accept, self.name = prompts, shuffle, seed, accept, name
        self.judged: dict[int, bool] = {}
        self.refused = 0
        self.epoch, self.offset = 0, 0
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.prompts)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.prompts), generator=generator).tolist()

    def take(self, count: int) -> list[Prompt]:
        return [self.prompts[row] for row in self.take_rows(count)]

    def take_rows(self, count: int) -> list[int]:
        """The next `count` rows' indices in self.prompts (a checkpoint can name drawn prompts by them)."""
        out = []
        while len(out) < count:
            if self.offset >= len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._order_for(self.epoch)
            row = self._order[self.offset]
            self.offset += 1
            if self.accept is not None and row not in self.judged:
                self.judged[row] = fits = self.accept(self.prompts[row])
                self.refused += not fits
                if self.refused == len(self.prompts):
                    raise DatasetError(f"dataset {self.name!r}: no row is short enough to generate from "
                                       "(data.max_input_seq_length, policy.max_total_sequence_length)")
            if not self.judged.get(row, True):
                continue
            out.append(row)
        return out

    @property
    def completed_epochs(self) -> int:
        """Passes over every row so far (the pass just drawn to its last row counts)."""
        return self.epoch + (self.offset >= len(self._order))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._order_for(self.epoch)


def build_messages(prompt: Prompt, system_prompt: str | None, instruction: str | None = None) -> list[dict]:
    if isinstance(prompt.input, list):
        messages = list(prompt.input)
    else:
        content = str(prompt.input) + (f"\n{instruction}" if instruction else "")
        messages = [{"role": "user", "content": content}]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}] + messages
    return messages


def prompt_token_ids(tokenizer, messages: list[dict], chat_template: str | None = None,
                     template_kwargs: dict | None = None) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        chat_template=chat_template, return_dict=False, **(template_kwargs or {}))
    return list(ids)
