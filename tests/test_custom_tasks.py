"""Your own data: lm-eval-like records from a file, a list or a datasets.Dataset become the same Task, evaluate to
the same log-likelihoods, and a bad record is refused naming its line and field."""

import json
import re

import numpy as np
import pytest

import lens_heads as lh
from conftest import LOGLIK_TOL, text_model
from lens_heads.data.custom_tasks import TaskFileError

RECORDS = [
    {"id": "q1", "context": "Question: What colour is the sky?\nAnswer:", "choices": ["blue", "green", "red"],
     "gold": 0},
    {"id": "q2", "context": "Question: How many legs has a cat?\nAnswer:", "choices": ["two", "four"], "gold": "four"},
    {"id": "q3", "context": "Question: Which is a fruit?\nAnswer:", "choices": ["apple", "stone", "car"], "gold": 0,
     "fewshot": [{"context": "Question: Which is wet?\nAnswer:", "choices": ["water", "sand"], "gold": 0}]},
]


def write_jsonl(path, records, extra_lines=()):
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_file_and_records_give_the_same_items(tmp_path):
    path = write_jsonl(tmp_path / "my_items.jsonl", RECORDS)
    from_file = lh.load_task(str(path))
    from_records = lh.task_from_records(RECORDS, name="my_items")
    assert from_file.name == "my_items" and from_file.format == "cloze" and len(from_file) == 3
    assert from_file.items == from_records.items
    q1, q2, q3 = from_file.items
    assert q1.id == "my_items/q1" and q1.continuations == (" blue", " green", " red") and q1.gold == 0
    assert q2.gold == 1  # the gold given as the choice's text
    assert q3.contexts[0] == ("Question: Which is wet?\nAnswer: water\n\nQuestion: Which is a fruit?\nAnswer:")
    assert from_file.meta()["source"].startswith(f"{path} (sha256 ")


def test_a_hugging_face_dataset_is_accepted():
    datasets = pytest.importorskip("datasets")
    plain = [{k: r[k] for k in ("id", "context", "choices")} | {"gold": 0} for r in RECORDS]
    task = lh.task_from_records(datasets.Dataset.from_list(plain), name="ds")
    assert task.items == lh.task_from_records(plain, name="ds").items


def test_letter_format_lists_the_choices():
    task = lh.task_from_records(RECORDS[:1], format="letter")
    item = task.items[0]
    assert item.contexts[0].endswith("A. blue\nB. green\nC. red\nAnswer:")
    assert item.continuations == (" A", " B", " C")


@pytest.mark.floats
def test_custom_task_evaluates_as_the_same_items_given_as_records(tmp_path):
    model = text_model(n_layers=2)
    path = write_jsonl(tmp_path / "items.jsonl", RECORDS)
    a = lh.evaluate(model, lh.load_task(str(path)), progress=False)
    b = lh.evaluate(model, lh.task_from_records(RECORDS, name="items"), progress=False)
    assert [r.logprobs for r in a.items] == [r.logprobs for r in b.items]
    # and it is not vacuous: another choice text changes that choice's log-likelihood
    changed = [dict(RECORDS[0], choices=["blue", "green", "purple"])] + RECORDS[1:]
    c = lh.evaluate(model, lh.task_from_records(changed, name="items"), progress=False)
    # the same choices in another batch (another padding and shared prefix): equal to float32 rounding
    np.testing.assert_allclose(c.items[0].logprobs[:2], a.items[0].logprobs[:2], **LOGLIK_TOL)
    assert not np.isclose(c.items[0].logprobs[2], a.items[0].logprobs[2])


@pytest.mark.parametrize("bad_line, words", [
    ('{"context": "x", "choices": ["a", "b"]}', ["line 3", "missing field 'gold'"]),
    ('{"context": "x", "gold": 0}', ["line 3", "'choices'"]),
    ('{"context": "x", "choices": ["a", "b"], "gold": 2}', ["line 3", "field 'gold'", "out of range", "0..1"]),
    ('{"context": "x", "choices": ["a", "b"], "gold": "c"}', ["line 3", "field 'gold'"]),
    ('{"context": "x", "choices": "ab", "gold": 0}', ["line 3", "field 'choices'"]),
    ('{"context": "", "choices": ["a"], "gold": 0}', ["line 3", "field 'context'"]),
    ('{"id": "q1", "context": "x", "choices": ["a", "b"], "gold": 0}', ["line 3", "field 'id'", "line 1"]),
    ('{"context": "x", "choices": ["a"], "gold": 0', ["line 3", "not valid JSON"]),
    ('["x"]', ["line 3", "JSON object"]),
    ('{"context": "x", "choices": ["a", "b"], "gold": 0, "fewshot": [{"context": "y"}]}',
     ["line 3", "fewshot", "choices"]),
    ('{"context": "x", "choices": ["a"], "gold": 0}', ["line 3", "field 'choices' has 1 choice", "at least two"]),
    ('{"context": "x", "choices": ["a", " "], "gold": 0}', ["line 3", "field 'choices'", "non-empty texts"]),
])
def test_a_malformed_file_names_the_line_and_field(tmp_path, bad_line, words):
    path = write_jsonl(tmp_path / "items.jsonl", RECORDS[:1], ["", bad_line])  # line 2 is blank: skipped
    with pytest.raises(TaskFileError) as e:
        lh.load_task(str(path))
    for w in [str(path)] + words:
        assert w in str(e.value), (w, str(e.value))


def test_records_errors_name_the_record():
    with pytest.raises(TaskFileError, match=r"record 1: field 'gold' is 7"):
        lh.task_from_records([RECORDS[0], dict(RECORDS[1], gold=7)])
    with pytest.raises(TaskFileError, match="repeats the id of record 0"):
        lh.task_from_records([RECORDS[0], RECORDS[0]])
    with pytest.raises(ValueError, match="unknown format"):
        lh.task_from_records(RECORDS, format="essay")
    with pytest.raises(lh.InputError, match=r"record 1: field 'choices' has 1 choice.*at least two"):
        lh.task_from_records([RECORDS[0], dict(RECORDS[1], choices=["four"], gold=0)])


def test_a_few_shot_example_needs_only_its_gold_choice():
    solved = {"context": "Question: Which is wet?\nAnswer:", "choices": ["water"], "gold": 0}
    task = lh.task_from_records([dict(RECORDS[0], fewshot=[solved])])
    assert task.items[0].contexts[0].startswith("Question: Which is wet?\nAnswer: water\n\nQuestion: What colour")


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_file_with_a_byte_order_mark_loads_as_the_same_file_without(tmp_path, suffix):
    text = "\n".join(json.dumps(r) for r in RECORDS) + "\n" if suffix == ".jsonl" else json.dumps(RECORDS)
    for folder in ("plain", "marked"):  # one file name in two folders: the same task name and ids
        (tmp_path / folder).mkdir()
    plain, marked = tmp_path / "plain" / f"items{suffix}", tmp_path / "marked" / f"items{suffix}"
    plain.write_bytes(text.encode("utf-8"))
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))  # as spreadsheet tools save "UTF-8" text
    with_mark, without = lh.load_task(str(marked)), lh.load_task(str(plain))
    assert len(without) == len(RECORDS) and with_mark.items == without.items


def test_a_file_not_in_utf8_is_refused_naming_the_file_and_line(tmp_path):
    path = tmp_path / "items.jsonl"
    latin = json.dumps({"context": "Caf\u00e9?", "choices": ["yes", "no"], "gold": 0}, ensure_ascii=False)
    path.write_bytes((json.dumps(RECORDS[0]) + "\n" + latin + "\n").encode("latin-1"))  # a legacy code page
    with pytest.raises(lh.InputError, match=re.escape(f"{path} line 2: not UTF-8 text")):
        lh.load_task(str(path))


def test_file_tasks_sample_by_seed_and_refuse_registry_options(tmp_path):
    many = [dict(RECORDS[0], id=f"r{i}", context=f"Question {i}: What colour is the sky?\nAnswer:") for i in range(12)]
    path = write_jsonl(tmp_path / "items.jsonl", many)
    samples = {}
    for seed in range(5):
        ids = [it.id for it in lh.load_task(str(path), n=4, seed=seed).items]
        # the documented sample: the first n of a seeded permutation of the file's records, kept in file order
        assert ids == [f"items/r{i}" for i in sorted(np.random.default_rng(seed).permutation(12)[:4])]
        samples[seed] = tuple(ids)
    assert len(set(samples.values())) > 1  # the seed changes the sample
    assert len(lh.load_task(str(path), n=2)) == 2
    assert [it.id for it in lh.load_task(str(path)).items] == [f"items/{r['id']}" for r in many]  # all, in order
    with pytest.raises(ValueError, match="fewshot"):
        lh.load_task(str(path), shots=2)
    with pytest.raises(ValueError, match="format"):
        lh.load_task("arc_easy", format="letter")
    with pytest.raises(FileNotFoundError):
        lh.load_task(str(tmp_path / "missing.jsonl"))


# ---------------------------------------------------------------- the report's --task-file


def test_report_task_file_replaces_the_default_tasks_unless_tasks_are_given(tmp_path):
    from lens_heads.report.__main__ import config_from_args
    from lens_heads.report.pipeline import load_tasks

    path = write_jsonl(tmp_path / "my_items.jsonl", RECORDS)
    config = config_from_args(["--task-file", str(path), "--task-format", "letter", "--n", "2"])
    assert config.tasks == () and config.task_file == str(path)
    tasks = load_tasks(config)
    assert list(tasks) == ["my_items"] and len(tasks["my_items"]) == 2 and tasks["my_items"].format == "letter"
    assert config_from_args(["--task-file", str(path), "--tasks", "piqa"]).tasks == ("piqa",)
    assert config_from_args([]).task_file is None and config_from_args([]).tasks == ("arc_easy",)


def test_report_refuses_a_malformed_task_file_in_one_line_before_loading_the_model(tmp_path, capsys, monkeypatch):
    from lens_heads.report import pipeline
    from lens_heads.report.__main__ import main

    monkeypatch.setattr(pipeline, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    path = write_jsonl(tmp_path / "items.jsonl", RECORDS, ['{"id": "q9", "context": "x", "choices": ["a"]}'])
    with pytest.raises(SystemExit) as e:
        main(["--task-file", str(path), "--out", str(tmp_path / "r"), "--no-progress"])
    assert e.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "line 4" in errors[0] and "'gold'" in errors[0], errors
    with pytest.raises(SystemExit) as e:
        main(["--task-file", str(tmp_path / "none.jsonl")])
    assert e.value.code == 2
