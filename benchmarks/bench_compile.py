"""``torch.compile`` (inductor) against the evaluator's eager forward and Hugging Face SDPA, on MMLU 5-shot rows.

    OMP_NUM_THREADS=2 python benchmarks/bench_compile.py --write     # docs/records/compile.json, ~5-10 min

A plain forward (logits at every position, batch 1, no hooks) over ``--mmlu-n`` MMLU 5-shot prompts of the embedded
model, each way in one process, alternating ``--repeats`` times; the fastest pass of each way is kept:

- ``evaluator (eager)``: the evaluator's forward (weights laid out once, fused attention, blocks that normalise once:
  :mod:`lens_heads.evaluation.passes`);
- ``compiled evaluator``: that forward under ``torch.compile`` (inductor, ``dynamic=True`` so that one graph serves
  every prompt length);
- ``compiled TransformerLens``: TransformerLens's own forward (eager attention) under ``torch.compile``, the same way;
- ``HF SDPA``: the same weights in Hugging Face with SDPA attention.

Compile time is the first pass of a compiled way minus its fastest pass, and is reported with the number of passes it
takes to earn back (with a cold inductor cache: a rerun finds its compiled kernels in ``TORCHINDUCTOR_CACHE_DIR``
and compiles faster). Logits are compared with the evaluator's eager forward (max absolute difference). A way that
fails to compile is recorded with its error and left out of the timings.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import lens_heads as lh
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.fast_blocks import fast_blocks
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.models.embedded import embedded_model_folder
from lens_heads.plumbing.provenance import code_commit
from lens_heads.plumbing.settings import option
from timing import cpu_description, load_average, parse_settings, print_and_write

RECORD = Path(__file__).resolve().parents[1] / "docs" / "records" / "compile.json"
BASE = "evaluator (eager)"


@dataclass(frozen=True)
class CompileSettings:
    """What the comparison runs."""

    mmlu_n: int = option(6, "MMLU 5-shot prompts (seed 0), each a forward of its own")
    repeats: int = option(3, "alternating passes over the prompts (the first of a compiled way includes compiling)")
    write: bool = option(False, "write docs/records/compile.json")


@contextlib.contextmanager
def evaluator_forward(model):
    """The evaluator's forward without hooks: weights laid out once, fused attention, blocks that normalise once."""
    with packed_weights(model), fused_attention(model), fast_blocks(model):
        yield


def ways(model, hf) -> dict[str, tuple[Callable, Callable[[], contextlib.AbstractContextManager]]]:
    """Per way, the forward (tokens -> logits) and the context it runs in."""
    # two functions, so that each compiled way keeps its own graphs (dynamo caches them per code object)
    def evaluator(tokens):
        return model(tokens)

    def transformer_lens(tokens):
        return model(tokens)

    compiled_eval = torch.compile(evaluator, dynamic=True)
    compiled_tl = torch.compile(transformer_lens, dynamic=True)
    return {
        BASE: (model, lambda: evaluator_forward(model)),
        "compiled evaluator": (compiled_eval, lambda: evaluator_forward(model)),
        "compiled TransformerLens": (compiled_tl, contextlib.nullcontext),
        "HF SDPA": (lambda tokens: hf(input_ids=tokens, use_cache=False).logits, contextlib.nullcontext),
    }


def one_pass(forward, context, rows) -> list[torch.Tensor]:
    with context():
        return [forward(torch.tensor([row.tokens]))[0] for row in rows]


def main(argv=None) -> None:
    s = parse_settings(CompileSettings, argv, __doc__)
    torch.set_grad_enabled(False)
    from transformers import AutoModelForCausalLM

    started = load_average()
    model = lh.load_model()
    hf = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32,
                                              attn_implementation="sdpa").eval()
    rows = build_rows(model, list(lh.load_task("mmlu", n=s.mmlu_n, seed=0)))
    lengths = [len(r.tokens) for r in rows]
    table = ways(model, hf)
    seconds: dict[str, list[float]] = {name: [] for name in table}
    logits: dict[str, list[torch.Tensor]] = {}
    errors: dict[str, str] = {}
    for round_ in range(s.repeats):
        for name, (forward, context) in table.items():
            if name in errors:
                continue
            start = time.perf_counter()
            try:
                out = one_pass(forward, context, rows)
            except Exception as e:  # a way that does not compile is recorded, not fatal
                errors[name] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                traceback.print_exc()
                continue
            seconds[name].append(time.perf_counter() - start)
            logits[name] = out
            print(f"pass {round_ + 1}: {name:26s} {seconds[name][-1]:7.1f} s", flush=True)
    timed = {name: walls for name, walls in seconds.items() if walls}
    best = {name: min(walls) for name, walls in timed.items()}
    tokens = sum(lengths)
    record = dict(
        cpu=cpu_description(), commit=code_commit(), torch=torch.__version__,
        load_average=dict(start=started, end=load_average()),
        settings=dict(mmlu_n=s.mmlu_n, repeats=s.repeats, tokens=tokens, lengths=[min(lengths), max(lengths)],
                      dynamic=True, backend="inductor"),
        seconds={name: [round(x, 3) for x in walls] for name, walls in timed.items()},
        tokens_per_s={name: round(tokens / t, 1) for name, t in best.items()},
        speed_vs_evaluator={name: round(best[BASE] / t, 3) for name, t in best.items()},
        speed_vs_hf_sdpa={name: round(best["HF SDPA"] / t, 3) for name, t in best.items()},
        compile_s={name: round(walls[0] - min(walls), 1) for name, walls in timed.items()
                   if name.startswith("compiled")},
        max_logit_difference_vs_evaluator={
            name: float(max((a - b).abs().max() for a, b in zip(out, logits[BASE])))
            for name, out in logits.items() if name != BASE},
        errors=errors,
    )
    record["passes_to_earn_back_compiling"] = {
        name: (round(c / (best[BASE] - best[name]), 1) if best[name] < best[BASE] else None)
        for name, c in record["compile_s"].items()}
    print_and_write(record, RECORD, s.write)


if __name__ == "__main__":
    main()
