"""What the two backends must agree on, computed the same way on either, and the HookedTransformer reference.

TransformerLens 3.9 (HookedTransformer) and 4.x (TransformerBridge) can't be installed side by side, so the
HookedTransformer side is computed once in the 3.9 environment and kept in ``tests/data/bridge_reference_*``
(``test_bridge.py`` checks, under 3.9, that it still is what HookedTransformer computes; under 4.x, that the
bridge computes the same). Write it again with::

    PYTHONPATH=. .venv/bin/python tests/bridge_agreement.py [smollm2-135m|gemma-3-270m]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent / "data"
PROMPTS = [  # different lengths: the batches are padded
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "One two three four five",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Attention heads that look only at the first token are said to be resting.",
]
TASK = dict(name="arc_easy", split="validation", n=6, seed=0)  # the split the stored reference was computed on
# zeroing by a pattern score, a value-norm score and an output-norm score, at about these shares of heads
ZEROING = [("AWFT", 0.3), ("AVVN", 0.2), ("AHON", 0.2)]


def reference_path(model_name: str) -> Path:
    return DATA / f"bridge_reference_{model_name}.safetensors"


def compute(model, zeroing_thresholds: dict[str, float] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Scores of ``PROMPTS``, and the task's log-likelihoods unablated and under each threshold zeroing (at
    ``zeroing_thresholds``, else chosen here from the scores), with the (row, layer, head) triples zeroed; then the
    rest of the contract (:func:`compute_rest`)."""
    from lens_heads import evaluate, load_task, score_heads, threshold_zeroing
    from lens_heads.heads.scores import DIRECTION

    scores = score_heads(model, PROMPTS, batch_size=4, progress=False)
    task = load_task(TASK["name"], split=TASK["split"], n=TASK["n"], seed=TASK["seed"])
    tensors = {"scores": scores.values.float(), "logprobs": _logprobs(evaluate(model, task, progress=False))}
    thresholds = zeroing_thresholds or {name: gap_threshold(scores.score(name), p if DIRECTION[name] == "<" else 1 - p)
                                        for name, p in ZEROING}
    for name, threshold in thresholds.items():
        ablation = threshold_zeroing(model, name, threshold)
        result = evaluate(model, task, hooks=ablation, progress=False)
        tensors[f"logprobs {name}"] = _logprobs(result)
        tensors[f"zeroed {name}"] = ablation.zeroed()
    tensors.update(compute_rest(model, task))
    return tensors, {"thresholds": thresholds, "score_names": scores.names}


def compute_rest(model, task) -> dict[str, torch.Tensor]:
    """Attention rank per head of two prompts, attribution-patching head effects on two items, and greedy
    generations with two heads zeroed, rerun and KV-cached."""
    from dataclasses import replace

    from lens_heads import attention_rank, head_effects, zero_heads
    from lens_heads.evaluation.generate import generate

    effects = head_effects(model, replace(task, items=list(task)[:2]), method="attribution", progress=False)
    out = {"rank": torch.as_tensor(attention_rank(model, PROMPTS[:2], progress=False).per_head).float(),
           "effects attribution": effects.values.double()}
    for cache in (False, True):
        heads = [(0, 1), (3, min(4, model.cfg.n_heads - 1))]  # two heads of any model's shape
        made = generate(model, PROMPTS[1], hooks=zero_heads(heads), max_new_tokens=8, cache=cache)
        out[f"generated cache={cache}"] = torch.tensor(made.tokens)
    return out


def gap_threshold(values: torch.Tensor, share: float) -> float:
    """A threshold near the ``share`` quantile of ``values`` but in the middle of the widest gap between
    neighbouring values around it, so a 1e-4 difference between backends can't move a head across it."""
    v = values.flatten().double().sort().values
    k = int(share * len(v))
    window = range(max(k - 8, 0), min(k + 8, len(v) - 1))
    i = max(window, key=lambda j: float(v[j + 1] - v[j]))
    return float((v[i] + v[i + 1]) / 2)


def _logprobs(result) -> torch.Tensor:
    return torch.tensor([lp for item in result.items for lp in item.logprobs], dtype=torch.float64)


def write_reference(model_name: str) -> Path:
    """Compute on HookedTransformer (TransformerLens 3.9) and store the values with their settings."""
    from safetensors.torch import save_file

    from lens_heads import load_model
    from lens_heads.models.backends import tl_version

    model = load_model(model_name, backend="hooked")
    tensors, meta = compute(model)
    meta.update(model=model_name, backend="hooked", transformer_lens=tl_version(), prompts=PROMPTS, task=TASK)
    path = reference_path(model_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"meta": json.dumps(meta)})
    return path


def read_reference(model_name: str) -> tuple[dict[str, torch.Tensor], dict]:
    from safetensors import safe_open

    with safe_open(str(reference_path(model_name)), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["meta"])


# How far apart two correct float32 computations of the reference can be. The same model and code on another
# machine sum in another order (matmul kernels, thread count, CPU vector width): each sum is off by a few
# u = 2**-24 (6e-8) of what it adds up, compounded over 30 layers. Measured against the stored SmolLM2 reference
# with 1 and 2 threads, and with ATen's unvectorised kernels and MKL's compatible code path (standing in for another
# CPU): summed log-likelihoods (8 to 81 in size) up to 8.2e-6 of their size apart (4.2e-4 at -51 under zeroing),
# scores up to 1.5e-5 (2.4e-5 for entropies near 0.08, 4e-7 apart), attribution effects up to 2e-4 (the largest is
# 3.3). SAME_CODE bounds each with a margin of 4x or more; BRIDGE adds the difference between the two
# implementations (measured: scores 1.3e-5 relative, log-likelihoods 2.8e-6 relative, effects 1.5e-5).
# AEQD is read off the fused attention as log-sum-exp minus q . (mean key): a difference of float32 numbers of
# magnitude ~10, each rounded to ~1e-6, so near zero its absolute rounding is a few of those (1.1e-6 seen between the
# vectorised and the unvectorised kernels on one machine); the other scores are sums of positive terms
AEQD_ATOL = 4e-6
SAME_CODE = dict(score_rtol=5e-5, logprob_atol=1e-5, logprob_rtol=3e-5, effects_atol=5e-4)
BRIDGE = dict(score_rtol=1e-4, logprob_atol=1e-4, logprob_rtol=3e-5, effects_atol=5e-4)


def assert_agree(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], *, score_rtol: float,
                 logprob_atol: float, logprob_rtol: float, effects_atol: float) -> None:
    """Scores (and ranks) to ``score_rtol`` relative (an absolute floor of 1e-6 for values near zero, ``AEQD_ATOL``
    for AEQD and AEQD (LN)),
    log-likelihoods to ``logprob_atol`` plus ``logprob_rtol`` relative, attribution effects (in their units) to
    ``effects_atol`` (see ``SAME_CODE`` and ``BRIDGE``), and exactly the same zeroed (row, layer, head) triples
    and generated tokens (the thresholds sit in wide gaps: :func:`gap_threshold`)."""
    assert set(got) == set(want), (sorted(got), sorted(want))
    for key in want:
        if key == "scores":  # [input, layer, head, score]: the AEQD columns with their own absolute floor
            from lens_heads.heads.scores import SCORE_NAMES

            assert want[key].shape[-1] == len(SCORE_NAMES), "stored scores are the twelve, in SCORE_NAMES' order"
            lse = torch.tensor([name.startswith("AEQD") for name in SCORE_NAMES])
            for columns, atol in ((~lse, 1e-6), (lse, AEQD_ATOL)):
                torch.testing.assert_close(got[key][..., columns], want[key][..., columns], rtol=score_rtol,
                                           atol=atol, msg=lambda m, key=key: f"{key}: {m}")
        elif key == "rank":
            torch.testing.assert_close(got[key], want[key], rtol=score_rtol, atol=1e-6, msg=lambda m, key=key: f"{key}: {m}")
        elif key.startswith("logprobs"):
            torch.testing.assert_close(got[key], want[key], rtol=logprob_rtol, atol=logprob_atol,
                                       msg=lambda m, key=key: f"{key}: {m}")
        elif key.startswith("effects"):
            # attribution sums gradient x activation over every position: the bound is absolute, in the effects'
            # units (1.5e-4 of the largest), since a small effect carries the rounding of the large terms summed
            torch.testing.assert_close(got[key], want[key], rtol=logprob_rtol, atol=effects_atol,
                                       msg=lambda m, key=key: f"{key}: {m}")
        else:
            assert got[key].shape == want[key].shape, (key, got[key].shape, want[key].shape)
            differ = (got[key] != want[key]).nonzero().tolist()
            assert not differ, f"{key}: different (row, layer, head) zeroed: {differ[:10]}"


if __name__ == "__main__":
    print(write_reference(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"))
