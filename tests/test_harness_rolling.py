"""lm-eval's ``loglikelihood_rolling`` on a document several contexts long: ``lens_heads`` equals lm-eval's own ``hf``
model on the same tiny Llama folder, through a local perplexity task YAML (wikitext's request type on a JSONL of
long documents); and under an ablation, every window runs under the hooks (a plain hooked forward per window)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import lens_heads as lh
from families import build_folder

lm_eval = pytest.importorskip("lm_eval", reason="the harness extra: pip install 'lens_heads[harness]'")
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from lens_heads.harness import LensHeadsLM  # noqa: E402

N_CTX = 64  # the family's max_position_embeddings
# Each window's log-likelihood sums <= 64 float32 log-softmaxes of logits computed by two code paths (Hugging Face
# and TransformerLens, float32): each term within ~1e-6 relative, so a document's sum within 1e-5 relative + 1e-4.
TOL = dict(rtol=1e-5, atol=1e-4)

YAML = """task: rolling_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
should_decontaminate: false
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("rolling")
    folder = build_folder("llama-3", root / "model")
    rng = np.random.default_rng(0)
    docs = [" ".join(f"t{i}" for i in rng.integers(3, 100, size=n)) for n in (230, 40, 129)]  # 3.6, 0.6, 2 windows
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (root / "rolling_local.yaml").write_text(YAML.format(data=root / "docs.jsonl"))
    return folder, docs, TaskManager(include_path=str(root), include_defaults=False)


def _per_doc(lm, manager) -> list[float]:
    results = lm_eval.simple_evaluate(model=lm, tasks=["rolling_local"], task_manager=manager, log_samples=True,
                                      bootstrap_iters=0)
    samples = sorted(results["samples"]["rolling_local"], key=lambda s: s["doc_id"])
    return [s["resps"][0][0] if isinstance(s["resps"][0], list) else s["resps"][0] for s in samples]


def test_rolling_windows_equal_lm_eval_hf(setting):
    folder, docs, manager = setting
    model = lh.load_model(str(folder), device="cpu")
    assert model.cfg.n_ctx == N_CTX
    lengths = [len(model.tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs]
    assert max(lengths) > 3 * N_CTX  # the case under test: several windows (and one text within one window)
    hf = HFLM(pretrained=str(folder), device="cpu", batch_size=4, max_length=N_CTX, dtype="float32")
    theirs = _per_doc(hf, manager)
    ours = _per_doc(LensHeadsLM(pretrained=model, progress=False, batch_size=4), manager)
    np.testing.assert_allclose(ours, theirs, **TOL)
    assert all(v < 0 for v in ours)


def _windows(tokens: list[int], prefix: int, n_ctx: int) -> list[tuple[list[int], list[int]]]:
    """Disjoint windows written out here: the first predicts the first n_ctx tokens after the prefix; each later
    one the next n_ctx (or what is left), conditioned on the n_ctx + 1 - its length tokens before them."""
    out, done = [([prefix], tokens[:n_ctx])], min(n_ctx, len(tokens))
    while done < len(tokens):
        end = min(done + n_ctx, len(tokens))
        out.append((tokens[end - n_ctx - 1: done], tokens[done:end]))
        done = end
    return out


def test_every_window_runs_under_the_ablation(setting):
    from lm_eval.api.instance import Instance

    folder, docs, _ = setting
    model = lh.load_model(str(folder), device="cpu")
    heads = [(0, 1), (1, 3)]
    requests = [Instance("loglikelihood_rolling", {}, (d,), i) for i, d in enumerate(docs)]
    got = LensHeadsLM(pretrained=model, progress=False, heads="0.1;1.3").loglikelihood_rolling(requests)
    hooks = lh.static_zeroing(model, heads)
    for text, value in zip(docs, got):
        tokens = model.tokenizer(text, add_special_tokens=False)["input_ids"]
        total = 0.0
        for context, predicted in _windows(tokens, model.tokenizer.bos_token_id, N_CTX):
            row = context + predicted
            with torch.no_grad(), hooks.batch(first=0), model.hooks(fwd_hooks=hooks.hooks):
                logp = model(torch.tensor([row[:-1]])).double().log_softmax(-1)[0]
            first = len(context) - 1
            total += float(logp[torch.arange(first, first + len(predicted)), torch.tensor(predicted)].sum())
        assert value == pytest.approx(total, rel=1e-5, abs=1e-4)
    plain = LensHeadsLM(pretrained=model, progress=False).loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, (d,), i) for i, d in enumerate(docs)])
    assert all(abs(a - b) > 1e-3 for a, b in zip(got, plain))  # the ablation changed every document's number
