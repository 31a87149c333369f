"""A model whose numbers go NaN or infinite never yields a number: a tiny Llama folder with one NaN in one o_proj
weight, loaded as a user would (``load_model(folder)``), against the same folder without it; and a bfloat16 model
with large logits, whose log-likelihoods must still be finite and right (float32 log-softmax)."""

import math

import numpy as np
import pytest
import torch

import lens_heads as lh
from conftest import LOGLIK_TOL, text_model
from families import build_folder
from lens_heads.data.items import Item, Task
from lens_heads.evaluation.generate import generate
from lens_heads.plumbing.errors import NonFiniteError

NAN_LAYER = 1  # the layer whose o_proj holds the NaN: layers before it stay finite
ATTN_OUT = r"(hook_attn_out|attn\.hook_out)"  # the attention's output: HookedTransformer's name, the bridge's


def three_choice_task(n: int = 6) -> Task:
    """Six three-choice items in the folder's word-level vocabulary ("t0".."t99")."""
    items = [Item(id=f"q{i}", contexts=(f"t{10 + i} t{20 + i} t{30 + i}",) * 3,
                  continuations=(f" t{40 + i}", f" t{50 + i}", f" t{60 + i}"), gold=i % 3) for i in range(n)]
    return Task(name="nan-probe", split="s", shots=0, format="cloze", n_total=n, seed=0, items=items)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The same tiny 3-layer Llama twice: intact, and with one NaN in layer NAN_LAYER's o_proj."""
    from safetensors.torch import load_file, save_file

    three = dict(num_hidden_layers=3)  # so a layer after the broken one has scores to go NaN
    intact = build_folder("llama-3", tmp_path_factory.mktemp("intact"), config=three)
    broken = build_folder("llama-3", tmp_path_factory.mktemp("nan"), config=three)
    weights = load_file(broken / "model.safetensors")
    weights[f"model.layers.{NAN_LAYER}.self_attn.o_proj.weight"][0, 0] = float("nan")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    return intact, broken


@pytest.fixture(scope="module")
def models(folders):
    return tuple(lh.load_model(str(f), device="cpu") for f in folders)


def test_evaluate_refuses_nan_log_likelihoods_naming_the_items_and_the_layer(models):
    _, broken = models
    with pytest.raises(NonFiniteError, match=rf"6 of 6 items .* q0, q1, q2, q3, q4 and 1 more.*"
                                             rf"blocks\.{NAN_LAYER}\.{ATTN_OUT}"):
        lh.evaluate(broken, three_choice_task(), progress=False)


@pytest.mark.floats
def test_excluding_nonfinite_items_counts_them_and_scores_only_the_rest(models):
    intact, broken = models
    task = three_choice_task()
    with pytest.raises(NonFiniteError, match="every item failed"):  # nothing would be left to score
        lh.evaluate(broken, task, progress=False, nonfinite="exclude")
    # a hook that makes the head outputs of two items' rows NaN: those two fail, the other four are scored
    poisoned = {"q1", "q4"}

    class Poison:
        """NaN into layer 0's hook_z of the rows of the poisoned items (told the rows' items per batch)."""

        def __init__(self):
            self.hooks = [("blocks.0.attn.hook_z", self.hook)]
            self.rows: list[int] = []

        def batch(self, attention_mask, inputs=None, **kw):
            import contextlib
            self.rows = list(inputs)
            return contextlib.nullcontext()

        def hook(self, z, hook):
            for b, item in enumerate(self.rows):
                if task.items[item].id in poisoned:
                    z[b] = float("nan")
            return z

    result = lh.evaluate(intact, task, hooks=Poison(), progress=False, nonfinite="exclude", batch_size=4)
    clean = lh.evaluate(intact, task, progress=False)
    assert result.meta["n_failed"] == 2 and sorted(result.meta["failed_items"]) == sorted(poisoned)
    kept = [it for it in clean.items if it.id not in poisoned]
    assert [it.id for it in result.items] == [it.id for it in kept]
    for mine, reference in zip(result.items, kept):  # the same numbers as unhooked (other batches: float rounding)
        np.testing.assert_allclose(mine.logprobs, reference.logprobs, **LOGLIK_TOL)
    assert result.accuracy == np.mean([it.correct() for it in kept])
    with pytest.raises(NonFiniteError, match=r"2 of 6 items .* the model's own forward is finite"):
        lh.evaluate(intact, task, hooks=Poison(), progress=False, batch_size=4)


def test_score_heads_refuses_nonfinite_scores(models):
    _, broken = models
    with pytest.raises(NonFiniteError, match=rf"blocks\.{NAN_LAYER}\.{ATTN_OUT}"):
        lh.score_heads(broken, three_choice_task(), progress=False)


def test_head_effects_and_generation_refuse(models):
    _, broken = models
    for method in ("ablation", "attribution"):
        with pytest.raises(NonFiniteError, match=rf"blocks\.{NAN_LAYER}\.{ATTN_OUT}"):
            lh.head_effects(broken, three_choice_task(2), method=method, progress=False)
    with pytest.raises(NonFiniteError, match="generation"):
        generate(broken, "t10 t20", max_new_tokens=3)


@pytest.mark.floats
def test_bfloat16_large_logits_give_finite_log_likelihoods_matching_float64(folders, tmp_path):
    """Logits of ~1e3 in bfloat16, where its spacing is 4-8: a bfloat16 log-softmax is off by units there. Each
    log-likelihood must equal a float64 log-softmax of the very bfloat16 logits lens_heads read (captured at
    ``unembed.hook_out``) to float32 rounding of their size (1e3 x 6e-8 x a few terms: 1e-3 is >10x that)."""
    import shutil

    from safetensors.torch import load_file, save_file

    intact, _ = folders
    big = shutil.copytree(intact, tmp_path / "big")
    weights = load_file(big / "model.safetensors")
    weights["lm_head.weight"] *= 400.0  # large logits
    save_file(weights, big / "model.safetensors", metadata={"format": "pt"})
    model = lh.load_model(str(big), device="cpu", dtype="bfloat16")
    assert model.W_U.dtype == torch.bfloat16
    task = three_choice_task()  # every continuation is one token: one logits row read per (item, choice)
    seen = []
    result = lh.evaluate(model, task, progress=False,
                         hooks=[("unembed.hook_out", lambda x, hook: seen.append(x.detach()[0].clone()))])
    rows = torch.cat(seen)
    assert rows.dtype == torch.bfloat16 and rows.abs().max() > 500  # the case under test
    reference = torch.log_softmax(rows.double(), -1)
    in_bf16 = torch.log_softmax(rows, -1).double()  # what a bfloat16 log-softmax would give
    worst_bf16 = 0.0
    for item, record in zip(task.items, result.items):
        for choice, continuation in enumerate(item.continuations):
            (target,) = model.to_tokens(continuation, prepend_bos=False)[0].tolist()
            value = record.logprobs[choice]
            assert math.isfinite(value)
            gaps = (reference[:, target] - value).abs()
            assert gaps.min() < 1e-3, (item.id, choice, value)
            worst_bf16 = max(worst_bf16, float((in_bf16[gaps.argmin(), target] - reference[gaps.argmin(), target]).abs()))
    assert worst_bf16 > 0.5  # a bfloat16 log-softmax would have failed the bound above


def test_the_report_marks_the_stages_of_a_nan_model_failed_and_says_why(tmp_path, monkeypatch, capsys):
    """A report of a model with one NaN in layer 0's W_O: the stages that would turn it into numbers fail, each
    saying why (NaN, the hook point), the command exits 1, and no NaN-made accuracy or score reaches results.json."""
    import json

    from lens_heads.report import pipeline
    from lens_heads.report.__main__ import main

    model = text_model(n_ctx=512)
    with torch.no_grad():
        model.blocks[0].attn.W_O[0, 0, 0] = float("nan")
    monkeypatch.setattr(pipeline, "load_model", lambda *args, **kwargs: model)
    out = tmp_path / "report"
    code = main(["tiny", "--tasks", "arc_easy", "--quick", "--n", "2", "--rank-n", "2", "--fractions", "0,0.25",
                 "--scores", "AWFT", "--no-png", "--no-progress", "--out", str(out)])
    assert code == 1
    stages = json.loads((out / "results.json").read_text())["stages"]
    failed = {name: st["reason"] for name, st in stages.items() if st["status"] == "failed"}
    assert {"scores:arc_easy", "rank"} <= set(failed), stages  # rank read NaN patterns as rank 0 before
    for name, reason in failed.items():
        assert "NonFiniteError" in reason and "NaN" in reason, (name, reason)
    assert "blocks.0.hook_attn_out" in failed["scores:arc_easy"]
