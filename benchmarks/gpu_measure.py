"""One shape measured by the GPU check: ``batch_size="auto"`` and its peak memory, the evaluator against Hugging Face
SDPA on the same batches and weights (tokens/s, largest log-likelihood difference), the scoring pass and a
threshold-zeroing sweep unit, each also as achieved FLOP/s; and the scoring pass against the evaluator's forward on
long prompts (:data:`LONG_PROMPTS` tokens)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from flops import evaluation_flops, forward_flops, peak_memory_gib, reset_peak_memory, synchronize
from gpu_rows import check_lengths, synthetic_task
from gpu_settings import GpuCheck
from gpu_shapes import build_pair
from lens_heads.ablation.specs import ThresholdAblation
from lens_heads.data.inputs import pad_id
from lens_heads.data.items import Task
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.logprobs import batches, pad_rows
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scoring import score_heads
from lens_heads.models.loading import model_meta
from lens_heads.sweep.run import run_unit
from timing import alternate, timed

SCORE, FRACTION = "AHON (LN)", 0.1
LONG_PROMPTS = (2048, 8192)  # tokens; a sixteenth of each with --smoke
LONG_TOKENS = 16384  # tokens per timed run (a sixteenth with --smoke): prompts of one length, as many as make this


@torch.no_grad()
def hf_logprobs(hf, model, task: Task, batch_size: int) -> list[list[float]]:
    """Each (item, choice)'s log-likelihood from the Hugging Face model ``hf``, on the evaluator's batches of the
    rows it builds for ``model`` (tokenised alike, so both timings include it), logits (lm_head, log_softmax) only
    at the positions read, as the evaluator computes them."""
    rows = build_rows(model, list(task))
    out = [[math.nan] * it.n_choices for it in task]
    device = hf.device
    for batch in batches(sorted(rows, key=lambda r: -len(r.tokens)), batch_size):
        tokens, mask = (t.to(device) for t in pad_rows(batch, pad_id(model)))
        hidden = hf.model(input_ids=tokens, attention_mask=mask.long()).last_hidden_state
        where = [(b, first + k, token, row.item, choice) for b, row in enumerate(batch)
                 for choice, first, ids in row.reads for k, token in enumerate(ids)]
        index = torch.tensor([w[:3] for w in where], device=device)
        logp = torch.log_softmax(hf.lm_head(hidden[index[:, 0], index[:, 1]]).float(), dim=-1)
        values = logp.gather(1, index[:, 2:3])[:, 0].double().cpu().tolist()
        for (_, _, _, item, choice), value in zip(where, values):
            out[item][choice] = value if math.isnan(out[item][choice]) else out[item][choice] + value
    return out


def logprobs_of(result) -> list[list[float]]:
    return [list(item.logprobs) for item in result.items]


def max_difference(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    return float(np.max(np.abs(np.asarray(a, float) - np.asarray(b, float))))


@dataclass
class ShapeResult:
    """Every figure of one shape; rates in tokens/s (real tokens) and useful FLOP/s."""

    shape: str
    n_params: int
    rows: int
    tokens: int
    auto_batch_size: int
    auto_peak_memory_gib: float | None
    evaluator_tokens_per_s: float
    hf_sdpa_tokens_per_s: float
    max_logprob_difference: float
    scoring_tokens_per_s: float
    threshold_unit_tokens_per_s: float
    threshold_unit_share_zeroed: float
    evaluator_flops_per_s: float
    hf_sdpa_flops_per_s: float
    scoring_flops_per_s: float
    threshold_unit_flops_per_s: float
    long_prompts: list[dict] = field(default_factory=list)  # per length: see long_prompt_rates
    forward_tokens_share: float = 1.0  # the evaluator's forward tokens / the rows' tokens (shared prefixes run once)

    @property
    def evaluator_vs_hf(self) -> float:
        return self.evaluator_tokens_per_s / self.hf_sdpa_tokens_per_s


def measure_shape(name: str, s: GpuCheck) -> ShapeResult:
    """Build the shape's pair and time the evaluator, HF SDPA, the scoring pass and a threshold unit on it."""
    device = s.device
    hf, model = build_pair(name, s.shape(name), device, s.torch_dtype, s.seed)
    task = synthetic_task(check_lengths(s.n_rows, s.smoke, s.seed), model.cfg.d_vocab, s.seed)
    lengths = [len(r.tokens) for r in build_rows(model, list(task))]
    warm_up = replace(task, items=task.items[:8])  # CUDA context, kernels' first launch, allocator
    evaluate(model, warm_up, batch_size=4, progress=False)
    hf_logprobs(hf, model, warm_up, 4)
    reset_peak_memory(device)
    auto = evaluate(model, task, batch_size="auto", progress=False)
    size, memory = auto.meta["batch_size"], peak_memory_gib(device)
    runs = alternate({"evaluator": lambda: logprobs_of(evaluate(model, task, batch_size=size, progress=False)),
                      "HF SDPA": lambda: hf_logprobs(hf, model, task, size)}, s.repeats)
    # the scoring pass and a threshold unit run fused attention too, but hold per layer the pattern's rows of a query
    # chunk (query_chunk x key floats per head) off the CPU: they size their own batches, found once before timing
    score_size = score_heads(model, task, batch_size="auto", progress=False).meta["batch_size"]
    scoring = timed(lambda: _synced(lambda: score_heads(model, task, batch_size=score_size, progress=False), device))
    threshold = thresholds(scoring.out, SCORE, [FRACTION])[FRACTION]
    unit = timed(lambda: run_unit(model, task, ThresholdAblation(SCORE, FRACTION, threshold=threshold),
                                  batch_size=score_size, progress=False))
    eval_flops, cfg = evaluation_flops(model, task), model.cfg
    score_flops, tokens = forward_flops(cfg, lengths, 0), sum(lengths)
    walls = dict(evaluator=runs["evaluator"].wall, hf=runs["HF SDPA"].wall, scoring=scoring.wall, unit=unit.wall)
    result = ShapeResult(
        shape=name, n_params=model_meta(model)["n_params"], rows=len(task), tokens=tokens, auto_batch_size=size,
        auto_peak_memory_gib=memory, evaluator_tokens_per_s=tokens / walls["evaluator"],
        hf_sdpa_tokens_per_s=tokens / walls["hf"],
        max_logprob_difference=max_difference(runs["evaluator"].out, runs["HF SDPA"].out),
        scoring_tokens_per_s=tokens / walls["scoring"], threshold_unit_tokens_per_s=tokens / walls["unit"],
        threshold_unit_share_zeroed=unit.out.realised_fraction,
        evaluator_flops_per_s=eval_flops / walls["evaluator"], hf_sdpa_flops_per_s=eval_flops / walls["hf"],
        scoring_flops_per_s=score_flops / walls["scoring"], threshold_unit_flops_per_s=eval_flops / walls["unit"])
    result.long_prompts = long_prompt_rates(model, s)
    result.forward_tokens_share = auto.meta["forward_tokens"] / auto.meta["row_tokens"]
    hf = model = None  # frees both before the next shape (the timing lambdas above hold them)
    reset_peak_memory(device)
    return result


def _synced(fn, device: str):
    out = fn()
    synchronize(device)
    return out


def long_prompt_rates(model, s: GpuCheck) -> list[dict]:
    """Per length of :data:`LONG_PROMPTS`: tokens/s and useful FLOP/s of ``score_heads`` and of the evaluator's
    forward (fused attention and packed weights, the blocks to the last residual stream: no logits, which the scoring
    pass does not compute either) on random prompts of that length, as many as make :data:`LONG_TOKENS` tokens, one
    batch each."""
    from lens_heads.evaluation.fused_attention import fused_attention
    from lens_heads.evaluation.packed_weights import packed_weights
    from lens_heads.models.backends import run_to_resid

    out = []
    gen = torch.Generator().manual_seed(s.seed)
    for length in LONG_PROMPTS:
        length, total = (max(16, length // 16), LONG_TOKENS // 16) if s.smoke else (length, LONG_TOKENS)
        n = max(1, total // length)
        tokens = torch.randint(5, model.cfg.d_vocab, (n, length), generator=gen)

        def forward():
            with torch.no_grad(), fused_attention(model), packed_weights(model):
                run_to_resid(model, tokens.to(s.device), None, stop=model.cfg.n_layers)
            synchronize(s.device)

        def scoring():
            score_heads(model, tokens, batch_size=n, progress=False)
            synchronize(s.device)

        forward(), scoring()  # first launches at this length, outside the timing
        runs = alternate({"evaluator": forward, "scoring": scoring}, s.repeats)
        flops = forward_flops(model.cfg, [length] * n, 0)
        out.append(dict(tokens=length, prompts=n, evaluator_tokens_per_s=n * length / runs["evaluator"].wall,
                        scoring_tokens_per_s=n * length / runs["scoring"].wall,
                        evaluator_flops_per_s=flops / runs["evaluator"].wall,
                        scoring_flops_per_s=flops / runs["scoring"].wall))
    return out
