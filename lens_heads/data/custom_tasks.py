"""Your own multiple-choice data as a :class:`~lens_heads.data.items.Task`, from lm-eval-like records.

Each record holds ``context`` (the prompt text), ``choices`` (the answer texts) and ``gold`` (the index of the
right choice, or its text); optional ``id`` (unique; the line or position otherwise) and ``fewshot`` (solved
examples put before the context: records with the same three fields, or ready strings). Two prompt formats:

- ``"cloze"`` (lm-eval's ``multiple_choice`` default): each choice is scored as ``target_delimiter + choice``
  after the context (few-shot examples rendered as ``context + delimiter + gold choice``, each followed by a blank
  line);
- ``"letter"`` (MMLU's layout): the choices are listed as "A. ...", "B. ..." under the context, then "Answer:",
  and the continuations are " A", " B", ...

:func:`task_from_records` takes a list of dicts or a Hugging Face ``datasets.Dataset``; :func:`read_task_file`
reads a JSON Lines file (one record a line) or a JSON list, UTF-8 with or without the byte-order mark spreadsheet
tools write. A bad record is refused with its line (or position) and field; an item needs at least two choices
(a few-shot example only its gold one).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

import numpy as np

from lens_heads.data.items import Item, Task, sample
from lens_heads.plumbing.errors import InputError

CUSTOM_FORMATS = ("cloze", "letter")
REQUIRED = ("context", "choices", "gold")
LETTER_LIMIT = 26


class TaskFileError(InputError):
    """A record of a custom task is malformed; the message names where (line or record) and the field."""


def task_from_records(records: Iterable[dict], *, name: str = "custom", format: str = "cloze",
                      target_delimiter: str = " ", n: int | None = None, seed: int = 0) -> Task:
    """A Task from lm-eval-like records (dicts or a ``datasets.Dataset``): ``context``, ``choices``, ``gold``;
    optional ``id`` and ``fewshot``. ``n`` draws a seeded sample (kept in order), as :func:`lens_heads.load_task`.
    Errors name the record by its position (from 0) and the field."""
    rows = list(records.to_list() if hasattr(records, "to_list") else records)
    return _task(rows, list(range(len(rows))), name=name, format=format, delimiter=target_delimiter, n=n, seed=seed,
                 source="records", where="record")


def read_task_file(path: str | Path, *, name: str | None = None, format: str = "cloze", target_delimiter: str = " ",
                   n: int | None = None, seed: int = 0) -> Task:
    """A Task from a JSON Lines file (one record a line; blank lines skipped) or a ``.json`` list of records.
    The task is named after the file's stem unless ``name`` is given; errors name the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {str(path)!r} does not exist")
    data = path.read_bytes()
    text = _text(path, data)
    if path.suffix == ".json":
        rows = _json_list(path, text)
        lines, where = list(range(len(rows))), f"{path} record"
    else:
        numbered = _json_lines(path, text)
        rows, lines, where = [r for _, r in numbered], [k for k, _ in numbered], f"{path} line"
    digest = hashlib.sha256(data).hexdigest()[:12]  # in the meta, so caches see a changed file
    return _task(rows, lines, name=name or path.stem, format=format, delimiter=target_delimiter, n=n, seed=seed,
                 source=f"{path} (sha256 {digest})", where=where)


def _task(rows: list, positions: list[int], *, name: str, format: str, delimiter: str, n: int | None, seed: int,
          source: str, where: str) -> Task:
    if format not in CUSTOM_FORMATS:
        raise InputError(f"unknown format {format!r} for a custom task: choose one of {', '.join(CUSTOM_FORMATS)}")
    if not rows:
        raise TaskFileError(f"{name}: no records")
    items: list[Item] = []
    seen: dict[str, int] = {}
    for pos, record in zip(positions, rows):
        at = f"{where} {pos}"
        item = _item(record, at, name, pos, format, delimiter)
        if item.id in seen:
            raise TaskFileError(f"{at}: field 'id': {item.id.split('/', 1)[1]!r} repeats the id of "
                                f"{where.split()[-1]} {seen[item.id]}")
        seen[item.id] = pos
        items.append(item)
    keep = sample(len(items), n, seed)
    return Task(name=name, split="custom", shots=_shots(rows), format=format, items=[items[i] for i in keep],
                n_total=len(items), seed=seed, source=source)


def looks_like_file(name: str) -> bool:
    """Whether a task name given to ``load_task`` means a file of records (a .jsonl/.json path or an existing
    file) rather than a registered benchmark."""
    return name.endswith((".jsonl", ".json")) or Path(name).is_file()


def _text(path: Path, data: bytes) -> str:
    """The file's bytes as text: UTF-8, a leading byte-order mark dropped (spreadsheet tools write one)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TaskFileError(f"{path} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): "
                            "save the file as UTF-8 (in a spreadsheet tool: CSV/text UTF-8)") from None


def _json_lines(path: Path, text: str) -> list[tuple[int, dict]]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{path} line {number}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict):
            raise TaskFileError(f"{path} line {number}: expected a JSON object with fields {', '.join(REQUIRED)}, "
                                f"got {type(record).__name__}")
        records.append((number, record))
    return records


def _json_list(path: Path, text: str) -> list[dict]:
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskFileError(f"{path} line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(records, list):
        raise TaskFileError(f"{path}: expected a JSON list of records (or use .jsonl, one record a line)")
    return records


def _item(record, at: str, name: str, pos: int, format: str, delimiter: str) -> Item:
    """One record as an Item; every check names the field."""
    if not isinstance(record, dict):
        raise TaskFileError(f"{at}: expected a record with fields {', '.join(REQUIRED)}, got {type(record).__name__}")
    context, choices, gold = _fields(record, at)
    if len(choices) < 2:
        raise TaskFileError(f"{at}: field 'choices' has {len(choices)} choice; a multiple-choice item needs at least "
                            f"two (the right one and a wrong one), got {choices!r}")
    item_id = record.get("id", pos)
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
        raise TaskFileError(f"{at}: field 'id' must be a string or a whole number, got {item_id!r}")
    prefix = "".join(_solved(example, f"{at} field 'fewshot' [{k}]", format, delimiter) + "\n\n"
                     for k, example in enumerate(_list(record.get("fewshot", []), at, "fewshot")))
    if format == "letter":
        if len(choices) > LETTER_LIMIT:
            raise TaskFileError(f"{at}: field 'choices' has {len(choices)} choices; the letter format takes at "
                                f"most {LETTER_LIMIT}")
        return Item(id=f"{name}/{item_id}", contexts=(prefix + _lettered(context, choices),) * len(choices),
                    continuations=tuple(f" {chr(65 + i)}" for i in range(len(choices))), gold=gold)
    return Item(id=f"{name}/{item_id}", contexts=(prefix + context,) * len(choices),
                continuations=tuple(delimiter + c for c in choices), gold=gold)


def _fields(record: dict, at: str) -> tuple[str, list[str], int]:
    missing = [f for f in REQUIRED if f not in record]
    if missing:
        raise TaskFileError(f"{at}: missing field {', '.join(map(repr, missing))} (a record needs "
                            f"{', '.join(REQUIRED)}; optional id, fewshot)")
    context, choices, gold = (record[f] for f in REQUIRED)
    if not isinstance(context, str) or not context.strip():
        raise TaskFileError(f"{at}: field 'context' must be non-empty text, got {context!r}")
    choices = _list(choices, at, "choices")
    if not choices or not all(isinstance(c, str) and c.strip() for c in choices):
        raise TaskFileError(f"{at}: field 'choices' must be a non-empty list of non-empty texts, got {choices!r}")
    if isinstance(gold, str) and gold in choices:
        gold = choices.index(gold)
    if isinstance(gold, bool) or not isinstance(gold, (int, np.integer)):
        raise TaskFileError(f"{at}: field 'gold' must be the index of the right choice (or its text), got {gold!r}")
    if not 0 <= gold < len(choices):
        raise TaskFileError(f"{at}: field 'gold' is {gold}, out of range for {len(choices)} choices "
                            f"(0..{len(choices) - 1})")
    return context, choices, int(gold)


def _list(value, at: str, field: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise TaskFileError(f"{at}: field {field!r} must be a list, got {type(value).__name__}")
    return list(value)


def _solved(example, at: str, format: str, delimiter: str) -> str:
    """A few-shot example as text: a ready string, or a record with its gold answer filled in."""
    if isinstance(example, str):
        return example
    if not isinstance(example, dict):
        raise TaskFileError(f"{at}: a few-shot example is a string or a record, got {type(example).__name__}")
    context, choices, gold = _fields(example, at)
    if format == "letter":
        return _lettered(context, choices) + f" {chr(65 + gold)}"
    return context + delimiter + choices[gold]


def _lettered(context: str, choices: list[str]) -> str:
    lines = [context.strip()] + [f"{chr(65 + i)}. {c}" for i, c in enumerate(choices)]
    return "\n".join(lines) + "\nAnswer:"


def _shots(records: list) -> int:
    counts = {len(r.get("fewshot", [])) for r in records if isinstance(r, dict)}
    return counts.pop() if len(counts) == 1 else -1  # -1: items differ in their number of examples

