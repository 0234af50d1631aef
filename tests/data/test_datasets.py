"""Prompt datasets from files and generators, as the loop reads them."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dockyard.config.schema.data import DatasetConfig
from dockyard.data.datasets import DatasetError, PromptLoader, build_messages, load_prompts, split_row_slice


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_row_slices():
    assert split_row_slice("d/a.jsonl@[2:5]")[1] == slice(2, 5)
    assert split_row_slice("a.jsonl@[:10]")[1] == slice(None, 10)
    assert split_row_slice("a.jsonl@[-3:]")[1] == slice(-3, None)
    assert split_row_slice("a.jsonl")[1] == slice(None)


def test_jsonl_with_slice_keys_and_filter(tmp_path):
    rows = [{"q": "x" * (i + 1), "a": str(i), "meta": {"i": i}} for i in range(10)]
    path = jsonl(tmp_path / "d.jsonl", rows)
    config = DatasetConfig(name="d", path=f"{path}@[2:8]", input_key="q", label_key="a", metadata_key="meta",
                           max_prompt_chars=6)
    prompts = load_prompts(config)
    assert [p.label for p in prompts] == ["2", "3", "4", "5"]  # rows 6, 7 are longer than 6 characters
    assert prompts[0].metadata == {"i": 2} and prompts[0].source == "d"


def test_parquet(tmp_path):
    pq.write_table(pa.table({"input": ["1+1", "2+2"], "label": ["2", "4"]}), tmp_path / "d.parquet")
    prompts = load_prompts(DatasetConfig(path=str(tmp_path / "d.parquet")))
    assert [(p.input, p.label, p.metadata) for p in prompts] == [("1+1", "2", {}), ("2+2", "4", {})]


@pytest.mark.parametrize("content,config,message", [
    ('{"input": "a", "label": "1"}\n{bad json\n', {}, r"d.jsonl:2: not valid JSON"),
    ('[1, 2]\n', {}, r"d.jsonl:1: each line must be a JSON object"),
    ('{"question": "a", "label": "1"}\n', {}, r"row 0: no 'input' column"),
    ('{"input": "a"}\n', {}, r"no 'label' column \(label_key; set it to null if unused\)"),
    ('{"input": "a", "label": "1", "metadata": 3}\n', {}, r"'metadata' must be a dict"),
    ('{"input": "aaaa", "label": "1"}\n', {"max_prompt_chars": 2}, r"no rows left after filtering"),
])
def test_bad_rows_are_named(tmp_path, content, config, message):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_prompts(DatasetConfig(path=str(tmp_path / "d.jsonl"), **config))


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(DatasetError, match="dataset file not found"):
        load_prompts(DatasetConfig(path=str(tmp_path / "none.jsonl")))
    (tmp_path / "d.tsv").write_text("a\tb\n")
    with pytest.raises(DatasetError, match="unsupported dataset format '.tsv'"):
        load_prompts(DatasetConfig(path=str(tmp_path / "d.tsv")))


def test_a_csv_file_with_quoted_fields(tmp_path):
    (tmp_path / "d.csv").write_text('Question,Correct Answer\n"What is 2, plus 2?",4\n"A ""quoted"" one",x\n')
    first, second = load_prompts(DatasetConfig(path=str(tmp_path / "d.csv"), input_key="Question",
                                               label_key="Correct Answer", metadata_key=None))
    assert (first.input, first.label) == ("What is 2, plus 2?", "4")
    assert second.input == 'A "quoted" one' and second.metadata == {"Question": 'A "quoted" one', "Correct Answer": "x"}


def test_gsm8k_pre_processor_on_a_file(tmp_path):
    path = jsonl(tmp_path / "g.jsonl", [{"question": "How many?", "answer": "1 + 1 = 2\n#### 2"}])
    (prompt,) = load_prompts(DatasetConfig(path=str(path), data_pre_processor="gsm8k"))
    assert (prompt.input, prompt.label) == ("How many?", "2")


def test_reasoning_gym_generator_rows_carry_their_entry():
    config = DatasetConfig(generator={"name": "basic_arithmetic", "size": 5, "seed": 3, "max_digits": 1})
    prompts = load_prompts(config)
    assert len(prompts) == 5
    entry = prompts[0].metadata["reasoning_gym_entry"]
    assert entry["question"] == prompts[0].input and entry["answer"] == prompts[0].label


def test_unknown_generator_option_is_a_dataset_error():
    with pytest.raises(DatasetError, match="data generator 'basic_arithmetic'"):
        load_prompts(DatasetConfig(generator={"name": "basic_arithmetic", "colour": "red"}))


def test_loader_is_seeded_resumable_and_reshuffles_each_epoch():
    prompts = list(range(10))
    a = PromptLoader(prompts, shuffle=True, seed=7)
    first = a.take(6)
    state = a.state_dict()
    rest = a.take(8)  # crosses into epoch 1
    b = PromptLoader(prompts, shuffle=True, seed=7)
    b.load_state_dict(state)
    assert b.take(8) == rest
    assert sorted(first + rest[:4]) == prompts
    assert a.epoch == 1 and rest[4:] != first[:4]
    assert PromptLoader(prompts, shuffle=False, seed=7).take(3) == [0, 1, 2]


def test_a_refused_row_is_skipped_judged_once_and_leaves_the_others_in_order():
    prompts = list(range(10))
    judged = []

    def short_enough(prompt):
        judged.append(prompt)
        return prompt % 3 != 0

    plain = PromptLoader(prompts, shuffle=True, seed=7).take(20)
    loader = PromptLoader(prompts, shuffle=True, seed=7, accept=short_enough)
    drawn = loader.take(12)
    assert drawn == [p for p in plain if p % 3 != 0][:12]
    assert sorted(judged) == prompts and {row for row, fits in loader.judged.items() if not fits} == {0, 3, 6, 9}
    assert loader.epoch == 1 and loader.completed_epochs == 1


def test_a_dataset_with_no_row_short_enough_is_named():
    with pytest.raises(DatasetError, match="dataset 'long': no row is short enough.*max_input_seq_length"):
        PromptLoader([1, 2], shuffle=False, seed=0, accept=lambda p: False, name="long").take(1)


def test_messages_get_system_prompt_and_instruction():
    from dockyard.data.datasets import Prompt

    messages = build_messages(Prompt("2+2?", "4", {}, "d"), "Be brief.", "Give only the final answer.")
    assert messages == [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "2+2?\nGive only the final answer."}]
