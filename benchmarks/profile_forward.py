"""Where the evaluator's forward spends its time, next to Hugging Face's forward of the same rows (issue #58).

    OMP_NUM_THREADS=2 python benchmarks/profile_forward.py --mmlu-n 2 --write     # docs/records/profile_forward.json

A plain forward (logits at every position, batch 1) over MMLU 5-shot prompts, alternating in one process: TL with
fused attention, TL with fused attention and packed weights (the evaluator's forward before fast blocks), fused
attention with fast blocks but without packed weights (the evidence for keeping them or not), the evaluator's forward
with oneDNN turned off (its products plain, :mod:`lens_heads.evaluation.blocked_linear`), the evaluator's forward now (fused attention, packed weights, :mod:`lens_heads.evaluation.fast_blocks`), and the same
weights in Hugging Face SDPA. Then one ``torch.profiler`` run of the evaluator's forward and of HF's: the ATen ops
by self CPU time. The record names the CPU (model, the flags avx2/avx512f/avx512_bf16/amx), torch's CPU capability,
the threads, the commit and the load average (other processes share the cores: read the ratios, measured side by
side).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench_fast_eval import hf_logits, load_models
from lens_heads import load_task
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.fast_blocks import fast_blocks
from lens_heads.evaluation.fused_attention import fused_attention
from lens_heads.evaluation.packed_weights import packed_weights
from lens_heads.plumbing.provenance import code_commit
from lens_heads.plumbing.settings import option
from timing import alternate, cpu_description, load_average, parse_settings, print_and_write

RECORD = Path(__file__).resolve().parents[1] / "docs" / "records" / "profile_forward.json"


@dataclass(frozen=True)
class ProfileSettings:
    """What the profile runs."""

    mmlu_n: int = option(2, "MMLU 5-shot prompts (seed 0)")
    repeats: int = option(1, "alternating timing rounds")
    top: int = option(12, "ATen ops kept per profile")
    write: bool = option(False, "write docs/records/profile_forward.json")


@torch.no_grad()
def tl_forward(model, rows, *contexts) -> list[torch.Tensor]:
    with contextlib.ExitStack() as stack:
        for make in contexts:
            stack.enter_context(make(model))
        return [model(torch.tensor([row.tokens]))[0] for row in rows]


def top_ops(fn, n: int) -> list[dict]:
    """The ``n`` ATen ops of most self CPU time in one run of ``fn``: name, calls, self seconds, share."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return [dict(op=e.key, calls=e.count, self_s=round(e.self_cpu_time_total / 1e6, 3),
                 share=round(e.self_cpu_time_total / total, 4)) for e in events[:n]]


def main(argv=None) -> None:
    s = parse_settings(ProfileSettings, argv, __doc__)
    torch.set_grad_enabled(False)
    started = load_average()
    model, hf = load_models(False)
    rows = build_rows(model, list(load_task("mmlu", n=s.mmlu_n, seed=0)))
    tokens = sum(len(r.tokens) for r in rows)
    forwards = {
        "TL fused": lambda: tl_forward(model, rows, fused_attention),
        "TL fused+packed": lambda: tl_forward(model, rows, packed_weights, fused_attention),
        "TL fused+fast blocks (no packed)": lambda: tl_forward(model, rows, fused_attention, fast_blocks),
        "TL evaluator (fused+packed+fast blocks)": lambda: tl_forward(model, rows, packed_weights, fused_attention,
                                                                      fast_blocks),
        "TL evaluator, plain products (oneDNN off)": lambda: tl_forward(
            model, rows, lambda m: torch.backends.mkldnn.flags(enabled=False), packed_weights, fused_attention,
            fast_blocks),
        "HF SDPA": lambda: hf_logits(hf["sdpa"], rows),
    }
    r = alternate(forwards, s.repeats)
    ours, theirs = "TL evaluator (fused+packed+fast blocks)", "HF SDPA"
    differences = {name: max(float((a - b).abs().max()) for a, b in zip(r[name].out, r["HF SDPA"].out))
                   for name in forwards if name != "HF SDPA"}
    record = dict(
        cpu=cpu_description(), torch=torch.__version__, commit=code_commit(), load_average=dict(start=started), rows=len(rows),
        tokens=tokens, lengths=[len(r.tokens) for r in rows],
        seconds={name: round(t.wall, 3) for name, t in r.items()},
        tokens_per_s={name: round(tokens / t.wall, 1) for name, t in r.items()},
        vs_hf_sdpa={name: round(r[theirs].wall / t.wall, 3) for name, t in r.items()},
        max_logit_difference_vs_hf=differences,
        profile={name: top_ops(forwards[name], s.top) for name in (ours, theirs)},
    )
    record["load_average"]["end"] = load_average()
    print_and_write(record, RECORD, s.write)


if __name__ == "__main__":
    main()
