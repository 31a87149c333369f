"""Whether two executions of a notebook show the same things: the same outputs, the same text around the numbers,
and every number within the rounding a float32 run on another CPU or thread count absorbs.

The rounding: a printed number may differ by one unit in its last printed digit (a value on a rounding boundary)
plus :data:`RELATIVE` of its size (float32 sums in another order, and a few training steps that carry them on);
figure data and the explorer's data, stored unrounded, by :data:`RELATIVE` of their size plus :data:`ABSOLUTE`; the
explorer's patterns (stored in 1/255 steps) by :data:`PATTERN_LEVELS` steps.
"""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np

RELATIVE = 1e-3
ABSOLUTE = 1e-6
PATTERN_LEVELS = 2
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|\bnan\b|\binf\b")
DATA_BLOCK = re.compile(r'<script type="application/json" id="([^"]*)-data">(.*?)</script>', re.S)
TYPED_ARRAY_DTYPES = {"f8": np.float64, "f4": np.float32, "i1": np.int8, "u1": np.uint8, "i2": np.int16,
                      "u2": np.uint16, "i4": np.int32, "u4": np.uint32}


def text_differences(committed: str, fresh: str, where: str) -> list[str]:
    """Where ``fresh`` differs from ``committed``: other text, another count of numbers, or a number out of the
    printed rounding."""
    if NUMBER.split(committed) != NUMBER.split(fresh):
        return [f"{where}: the text differs:\n--- committed\n{committed[:2000]}\n--- fresh\n{fresh[:2000]}"]
    problems = []
    for a, b in zip(NUMBER.findall(committed), NUMBER.findall(fresh)):
        if not _printed_close(a, b):
            problems.append(f"{where}: {a} committed, {b} now")
    return problems


def _printed_close(a: str, b: str) -> bool:
    x, y = float(a), float(b)
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or math.isinf(y):
        return a == b
    mantissa = re.split(r"[eE]", a)[0]
    decimals = len(mantissa.split(".", 1)[1]) if "." in mantissa else 0
    exponent = int(re.split(r"[eE]", a)[1]) if re.search(r"[eE]", a) else 0
    unit = 10.0 ** (exponent - decimals) if decimals or exponent else 0.0
    return abs(x - y) <= unit * (1 + 1e-9) + RELATIVE * max(abs(x), abs(y))


def json_differences(committed, fresh, where: str) -> list[str]:
    """Where two JSON values differ: structure and strings exactly, numbers (plotly's base64 typed arrays
    decoded) within :data:`RELATIVE` and :data:`ABSOLUTE`, the explorer's ``patterns`` within
    :data:`PATTERN_LEVELS` steps."""
    if _is_typed_array(committed) and _is_typed_array(fresh):
        return _array_differences(_typed_array(committed), _typed_array(fresh), where)
    if isinstance(committed, dict) and isinstance(fresh, dict):
        if committed.keys() != fresh.keys():
            return [f"{where}: keys {sorted(committed)} committed, {sorted(fresh)} now"]
        problems = []
        for key in committed:
            if key == "patterns" and isinstance(committed[key], str):
                problems += _pattern_differences(committed[key], fresh[key], f"{where}.patterns")
            elif key == "rank" and "values" in committed:
                problems += _rank_differences(committed["values"], committed[key], fresh[key], f"{where}.rank")
            else:
                problems += json_differences(committed[key], fresh[key], f"{where}.{key}")
        return problems
    if isinstance(committed, list) and isinstance(fresh, list):
        if len(committed) != len(fresh):
            return [f"{where}: {len(committed)} entries committed, {len(fresh)} now"]
        return [p for i, (a, b) in enumerate(zip(committed, fresh)) for p in json_differences(a, b, f"{where}[{i}]")]
    numbers = (int, float)
    if isinstance(committed, numbers) and isinstance(fresh, numbers) and not isinstance(committed, bool) \
            and not isinstance(fresh, bool):
        return _array_differences(np.array([committed], float), np.array([fresh], float), where)
    return [] if committed == fresh else [f"{where}: {committed!r} committed, {fresh!r} now"]


def _is_typed_array(value) -> bool:
    return isinstance(value, dict) and {"dtype", "bdata"} <= value.keys()


def _typed_array(value: dict) -> np.ndarray:
    array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=TYPED_ARRAY_DTYPES[value["dtype"]])
    return array.reshape([int(n) for n in str(value["shape"]).split(",")]) if "shape" in value else array


def _array_differences(a: np.ndarray, b: np.ndarray, where: str) -> list[str]:
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        return [f"{where}: shape {a.shape} committed, {b.shape} now"]
    same_missing = np.array_equal(np.isnan(a), np.isnan(b))
    ok = np.isnan(a) | (np.abs(a - b) <= ABSOLUTE + RELATIVE * np.maximum(np.abs(a), np.abs(b)))
    if same_missing and ok.all():
        return []
    worst = int(np.argmax(np.where(np.isnan(a) | np.isnan(b), np.inf, np.abs(a - b))))
    return [f"{where}: {int((~ok).sum())} of {a.size} values differ, e.g. {a.flat[worst]!r} committed, "
            f"{b.flat[worst]!r} now"]


def _rank_differences(values, committed, fresh, where: str) -> list[str]:
    """Ranks of the explorer's heads: a rank may move only as far as the values it orders tie within the rounding
    (a head among k values within :data:`RELATIVE`/:data:`ABSOLUTE` of its own can take any of k places)."""
    v = np.asarray(values, float).ravel()
    a, b = np.asarray(committed, float).ravel(), np.asarray(fresh, float).ravel()
    if a.shape != b.shape or a.shape != v.shape:
        return [f"{where}: shape {a.shape} committed, {b.shape} now"]
    ties = (np.abs(v[:, None] - v[None, :]) <= ABSOLUTE + RELATIVE * np.maximum(np.abs(v[:, None]),
                                                                                 np.abs(v[None, :]))).sum(1)
    moved = np.abs(a - b) > ties - 1
    if not moved.any():
        return []
    worst = int(np.argmax(moved))
    return [f"{where}: {int(moved.sum())} of {a.size} ranks moved further than their values tie, e.g. "
            f"{a[worst]!r} committed, {b[worst]!r} now"]


def _pattern_differences(a: str, b: str, where: str) -> list[str]:
    x = np.frombuffer(base64.b64decode(a), np.uint8).astype(int)
    y = np.frombuffer(base64.b64decode(b), np.uint8).astype(int)
    if x.shape != y.shape or np.abs(x - y).max(initial=0) > PATTERN_LEVELS:
        return [f"{where}: the stored patterns differ by more than {PATTERN_LEVELS}/255"]
    return []


def html_differences(committed: str, fresh: str, where: str) -> list[str]:
    """An HTML output: its JSON data blocks by :func:`json_differences` (their element ids, fresh per rendering,
    set aside), the rest as text by :func:`text_differences`."""
    blocks_a, blocks_b = DATA_BLOCK.findall(committed), DATA_BLOCK.findall(fresh)
    if len(blocks_a) != len(blocks_b):
        return [f"{where}: {len(blocks_a)} data blocks committed, {len(blocks_b)} now"]
    problems = []
    for (id_a, data_a), (id_b, data_b) in zip(blocks_a, blocks_b):
        problems += json_differences(json.loads(data_a), json.loads(data_b), f"{where} data")
        committed, fresh = committed.replace(data_a, "").replace(id_a, "ID"), fresh.replace(data_b, "").replace(id_b, "ID")
    return problems + text_differences(committed, fresh, where)
