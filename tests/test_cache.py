"""The one keyed store behind every resumable result: reuse only under an equal key, never a torn file."""

import json

import pytest

from lens_heads.plumbing.cache import Cache, claim_folder, keyed, load_keyed, save_keyed
from lens_heads.plumbing.io import slug


def test_value_is_reused_only_under_the_same_key(tmp_path):
    path = tmp_path / "entry.json"
    calls = []
    compute = lambda: calls.append(1) or {"acc": 0.5}  # noqa: E731
    assert keyed(path, {"n": 8, "fractions": (0.1, 0.2)}, compute) == {"acc": 0.5}
    assert keyed(path, {"fractions": [0.1, 0.2], "n": 8}, compute) == {"acc": 0.5}  # tuple == list, order free
    assert len(calls) == 1
    assert load_keyed(path, {"n": 9, "fractions": [0.1, 0.2]}) is None
    assert json.loads(path.read_text())["key"] == {"fractions": [0.1, 0.2], "n": 8}  # the key is stored beside it


def test_torn_or_missing_entries_read_as_absent(tmp_path):
    path = tmp_path / "entry.json"
    assert load_keyed(path, {"a": 1}) is None
    path.write_text('{"key": {"a": 1}, "val')
    assert load_keyed(path, {"a": 1}) is None
    save_keyed(path, {"a": 1}, [1, 2])
    assert load_keyed(path, {"a": 1}) == [1, 2]
    assert not list(tmp_path.glob(".*.tmp"))


def test_claimed_folder_refuses_another_configuration(tmp_path):
    claim_folder(tmp_path, {"model": "m", "seed": 0})
    claim_folder(tmp_path, {"model": "m", "seed": 0})
    with pytest.raises(ValueError, match="differs in seed"):
        claim_folder(tmp_path, {"model": "m", "seed": 1})


def test_file_entries_are_written_once_and_marked_last(tmp_path):
    cache = Cache(tmp_path)
    writes = []

    def write(path):
        writes.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("payload")

    assert cache.file("scores", {"n": 4}, ".txt", write, lambda p: p.read_text()) == "payload"
    assert cache.file("scores", {"n": 4}, ".txt", write, lambda p: p.read_text()) == "payload"
    assert len(writes) == 1
    cache.path("scores", {"n": 4}, ".json").unlink()  # killed before the marker: the file is not trusted
    cache.file("scores", {"n": 4}, ".txt", write, lambda p: p.read_text())
    assert len(writes) == 2
    assert cache.path("scores", {"n": 4}) != cache.path("scores", {"n": 5})


def test_slug():
    assert slug("AHON (LN)") == "AHON_LN"
    assert slug("HuggingFaceTB/SmolLM2-135M", keep="-.") == "HuggingFaceTB_SmolLM2-135M"
