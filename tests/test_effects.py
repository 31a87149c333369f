"""Head effects: ablation against a single-head removal done by hand on the residual stream, attribution against
the hand-written gradient and against ablation where the first-order term is nearly exact; resuming; bad input."""

import json
import math

import numpy as np
import pytest
import torch

from conftest import LOGLIK_TOL, tiny_tokenizer
from lens_heads import head_effects
from lens_heads.ablation.hooks import mean_z
from lens_heads.data.items import Item, Task
from lens_heads.experiments.effects import EFFECT_METRICS, HeadEffects
from lens_heads.models.loading import tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def toy_task() -> Task:
    """Cloze items (one row per choice, multi-token answers) and a letter-style item (one row, four reads). The
    contexts end without whitespace and the answers start with a space, so every tokenisation agrees."""
    items = [Item("sky", ("The sky is",) * 3, (" blue", " green", " very loud today"), 0),
             Item("water", ("Water is",) * 2, (" wet", " dry and hot"), 1),
             Item("letter", ("Question: pick a letter\nAnswer:",) * 4, (" A", " B", " C", " D"), 2),
             Item("cat", ("A cat likes to",) * 2, (" sleep", " fly"), 0)]
    return Task(name="toy", split="test", shots=0, format="cloze", items=items, n_total=len(items), seed=0)


def one_layer(tokenizer, *, norm, scale_W_O=1.0, seed=0):
    model = tiny_model("gpt2", seed=seed, n_layers=1, attn_only=True, normalization_type=norm,
                       d_vocab=len(tokenizer), tokenizer=tokenizer)
    with torch.no_grad():
        model.blocks[0].attn.W_O.mul_(scale_W_O)
    return model


def choice_tokens(model, context, continuation):
    def enc(s):
        return model.tokenizer(s, add_special_tokens=False)["input_ids"]
    return enc(context), enc(continuation)


def per_choice(model, task, measure) -> list[np.ndarray]:
    """Per item, ``measure(ctx, cont, logits, cache)`` of each choice, the choice run alone with its cache."""
    out = []
    with torch.no_grad():
        for item in task:
            pairs = [choice_tokens(model, c, k) for c, k in zip(item.contexts, item.continuations)]
            out.append(np.array([measure(ctx, cont, *model.run_with_cache(torch.tensor([ctx + cont])))
                                 for ctx, cont in pairs]))
    return out


def hand_logprobs(model, task, change=None):
    """Per item, per choice: summed log-prob of the continuation, from the residual stream after the only layer,
    minus ``change(z) -> [pos, d_model]`` (what the removed head wrote) when given."""
    def logprob(ctx, cont, _, cache):
        resid = cache["blocks.0.hook_resid_post"][0]
        if change is not None:
            resid = resid - change(cache["blocks.0.attn.hook_z"][0])
        final = model.ln_final(resid[None])[0] if model.cfg.normalization_type else resid
        logp = torch.log_softmax((final @ model.W_U + model.b_U).double(), dim=-1)
        return sum(logp[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont))

    return per_choice(model, task, logprob)


def metrics_by_hand(removed, base, task):
    """The three per-item metrics from per-choice log-likelihoods, written out."""
    def dist(s):
        e = np.exp(s - s.max())
        return e / e.sum()

    rows = []
    for r, b, item in zip(removed, base, task):
        p, q = dist(b), dist(r)
        rows.append([r[item.gold] - b[item.gold], float(np.sum(p * (np.log(p) - np.log(q)))),
                     float(np.argmax(r) == item.gold) - float(np.argmax(b) == item.gold)])
    return np.array(rows)  # [item, metric] in EFFECT_METRICS order


@pytest.mark.floats
def test_ablation_equals_removing_the_heads_output_from_the_residual_by_hand(tokenizer):
    model = one_layer(tokenizer, norm="LN")
    task = toy_task()
    effects = head_effects(model, task, method="ablation", progress=False, batch_size=3)
    assert effects.metrics == list(EFFECT_METRICS) and effects.item_ids == [it.id for it in task]
    base = hand_logprobs(model, task)
    # each metric compares two summed log-likelihoods computed in float32 on another path than the hand forward's
    # (batched, fused): twice the rounding of the largest of them
    atol = 2 * (LOGLIK_TOL["atol"] + LOGLIK_TOL["rtol"] * max(np.abs(b).max() for b in base))
    W_O = model.W_O[0].detach()
    for head in range(model.cfg.n_heads):
        removed = hand_logprobs(model, task, lambda z: z[:, head] @ W_O[head])
        np.testing.assert_allclose(effects.values[:, 0, head].numpy(), metrics_by_hand(removed, base, task),
                                   atol=atol)
    assert effects.size("gold_logprob").min() > 1e-3  # every head changes something: the comparison is not empty

    means = mean_z(model, task)
    mean_effects = head_effects(model, task, method="mean", progress=False)
    for head in range(model.cfg.n_heads):
        removed = hand_logprobs(model, task, lambda z: (z[:, head] - means[0, head]) @ W_O[head])
        np.testing.assert_allclose(mean_effects.values[:, 0, head].numpy(), metrics_by_hand(removed, base, task),
                                   atol=atol)


def hand_linearised(model, task, head: int) -> list[np.ndarray]:
    """Per item, per choice: the first-order change of the choice's log-likelihood when ``head`` of the one
    attention-only layer without norms is zeroed. There logits = (resid + sum_h z_h W_O[h]) W_U + b_U, so
    d logP(t at p) / d z_h[p] = W_O[h] W_U (onehot(t) - softmax(logits[p])) at the positions read, 0 elsewhere."""
    W_O, W_U = model.W_O[0].detach().double(), model.W_U.detach().double()

    def change(ctx, cont, logits, cache):
        z = cache["blocks.0.attn.hook_z"][0, :, head].double()
        probs = torch.softmax(logits[0].double(), dim=-1)
        positions = [len(ctx) - 1 + k for k in range(len(cont))]
        return sum(float(-(z[p] @ (W_O[head] @ (W_U[:, t] - W_U @ probs[p])))) for p, t in zip(positions, cont))

    return per_choice(model, task, change)


@pytest.mark.slow
def test_attribution_is_the_hand_written_first_order_term(tokenizer):
    model = one_layer(tokenizer, norm=None)
    task = toy_task()
    effects = head_effects(model, task, method="attribution", progress=False, batch_size=2)
    base = hand_logprobs(model, task)
    for head in range(model.cfg.n_heads):
        linearised = hand_linearised(model, task, head)
        expected = metrics_by_hand([b + c for b, c in zip(base, linearised)], base, task)
        # float32 gradient x activation sums against the hand-written float64 product: seen 1.5e-8 apart at effects
        # of up to 0.04 (no log-likelihoods subtracted, so no cancellation to absorb)
        np.testing.assert_allclose(effects.values[:, 0, head].numpy(), expected, atol=1e-5)


@pytest.mark.floats
def test_attribution_matches_ablation_where_the_first_order_term_is_nearly_exact(tokenizer):
    """With W_O scaled down, a head moves the logits by O(1e-3): the second-order rest is O(1e-6) (9e-7 here), the
    KL's (itself O(1e-7)) O(1e-12). In float64, so that rounding (an ablation effect of 1e-3 is the difference of two
    log-likelihoods of up to 55: 1e-5 apart in float32) leaves only the rest to bound."""
    model = one_layer(tokenizer, norm=None, scale_W_O=0.05).to(torch.float64, print_details=False)
    task = toy_task()
    ablation = head_effects(model, task, method="ablation", progress=False)
    attribution = head_effects(model, task, method="attribution", progress=False)
    def gold(e):
        return e.effect("gold_logprob").numpy()
    assert np.abs(gold(ablation)).max() > 1e-3  # the effects are far larger than the tolerance
    np.testing.assert_allclose(gold(attribution), gold(ablation), atol=1e-5)
    np.testing.assert_allclose(attribution.effect("kl").numpy(), ablation.effect("kl").numpy(), atol=1e-9)


@pytest.mark.slow
def test_a_killed_run_resumes_from_the_finished_heads_with_the_same_numbers(tokenizer, tmp_path):
    model = tiny_model("llama", seed=1, d_vocab=len(tokenizer), tokenizer=tokenizer)
    task = toy_task()
    whole = head_effects(model, task, method="ablation", progress=False)
    out = tmp_path / "effects"
    first = head_effects(model, task, method="ablation", out_dir=out, progress=False)
    heads = sorted(out.glob("L*H*.json"))
    assert len(heads) == model.cfg.n_layers * model.cfg.n_heads and first.meta["units_run"] == len(heads) + 1
    for path in heads[3:6]:  # never finished
        path.unlink()
    heads[0].write_text(heads[0].read_text()[:100])  # cut short by the kill
    resumed = head_effects(model, task, method="ablation", out_dir=out, progress=False)
    assert resumed.meta["units_run"] == 4 and resumed.meta["units_reused"] == len(heads) + 1 - 4
    assert torch.equal(resumed.values, whole.values) and torch.equal(first.values, whole.values)
    with pytest.raises(ValueError, match="another configuration"):
        head_effects(model, task, method="mean", out_dir=out, progress=False)


def test_summaries_save_and_load(tokenizer, tmp_path):
    model = tiny_model("gpt2", seed=2, d_vocab=len(tokenizer), tokenizer=tokenizer)
    effects = head_effects(model, toy_task(), method="attribution", metric="gold_logprob", progress=False)
    x = effects.effect().numpy()
    np.testing.assert_allclose(effects.size().numpy(), np.abs(x).mean(0))
    df = effects.to_dataframe()
    row = df[(df["metric"] == "gold_logprob") & (df["layer"] == 1) & (df["head"] == 2)].iloc[0]
    v = x[:, 1, 2]
    half = 1.959963984540054 * v.std(ddof=1) / math.sqrt(len(v))
    assert row["mean"] == pytest.approx(v.mean()) and row["ci_high"] == pytest.approx(v.mean() + half)
    assert row["size"] == pytest.approx(np.abs(v).mean())
    size = np.abs(x).mean(0)
    assert [size[l, h] for l, h in effects.order()] == sorted(size.reshape(-1).tolist())
    assert len(effects.to_dataframe(per_item=True)) == x.size * len(EFFECT_METRICS)
    loaded = HeadEffects.load(effects.save(tmp_path / "e.safetensors"))
    assert torch.equal(loaded.values, effects.values) and loaded.metric == "gold_logprob"
    assert loaded.method == "attribution" and loaded.item_ids == effects.item_ids
    assert json.dumps(loaded.meta, default=str) == json.dumps(effects.meta, default=str)


def test_bad_input_says_what_to_do(tokenizer):
    model = tiny_model("gpt2", d_vocab=len(tokenizer), tokenizer=tokenizer)
    task = toy_task()
    with pytest.raises(ValueError, match="unknown method 'patching'"):
        head_effects(model, task, method="patching")
    with pytest.raises(ValueError, match="unknown metric 'loss'"):
        head_effects(model, task, metric="loss")
    empty = Task(name="empty", split="test", shots=0, format="cloze", items=[], n_total=0, seed=0)
    with pytest.raises(ValueError, match="no items"):
        head_effects(model, empty)
    with pytest.raises(ValueError, match="HeadEffects.save"):
        head_effects(model, task, method="attribution", out_dir="unused")
    with pytest.raises(ValueError, match="no tokenizer"):
        head_effects(tiny_model("gpt2"), task)


@pytest.mark.slow
def test_oracle_zeroes_the_heads_with_the_smallest_effect_first(tokenizer, tmp_path):
    from lens_heads.ablation.hooks import zero_heads
    from lens_heads.evaluation.evaluate import evaluate
    from lens_heads.experiments.effects import oracle_sweep

    model = tiny_model("llama", seed=3, d_vocab=len(tokenizer), tokenizer=tokenizer)
    task = toy_task()
    effects = head_effects(model, task, method="attribution", progress=False)
    order = effects.order()
    size = effects.size().numpy()
    assert size[order[0]] == size.min() and size[order[-1]] == size.max()
    sweep = oracle_sweep(model, task, order, fractions=(0.25, 0.5), out_dir=tmp_path, progress=False)
    curve = sweep.curves("static")["oracle"]
    assert [u.realised_fraction for u in curve] == [0.0, 0.25, 0.5]
    for unit, k in zip(curve, (0, 2, 4)):
        expected = evaluate(model, task, hooks=zero_heads(order[:k]), progress=False)
        for got, want in zip(unit.result.items, expected.items):
            np.testing.assert_allclose(got.logprobs, want.logprobs, **LOGLIK_TOL)
    again = oracle_sweep(model, task, order, fractions=(0.25, 0.5), out_dir=tmp_path, progress=False)
    assert [u.result.items for u in again.units] == [u.result.items for u in sweep.units]
    assert set(sweep.to_dataframe()["curve"]) == {"oracle (static)"} and set(sweep.to_dataframe()["mode"]) == {"static"}
    with pytest.raises(ValueError, match="each of the model's"):
        oracle_sweep(model, task, order[:-1], progress=False)


def test_attribution_on_a_task_of_single_continuations_is_refused_with_what_to_use(tokenizer):
    """LAMBADA and GSM8K items have one continuation, correct when greedy: nothing to linearise (it raised an
    IndexError inside the records)."""
    model = one_layer(tokenizer, norm=None)
    items = [Item(id=f"g{i}", contexts=(f"Count: {i}, {i + 1},",), continuations=(f" {i + 2}",), gold=0)
             for i in range(3)]
    task = Task(name="lambada", split="test", shots=0, format="greedy", items=items, n_total=3, seed=0)
    with pytest.raises(ValueError, match=r"method='attribution'.*lambada.*method='ablation'"):
        head_effects(model, task, method="attribution", progress=False)
    assert head_effects(model, task, method="ablation", progress=False).values.shape[0] == 3
