"""Whole-layer removal and layer scores: the hooks against a forward written by hand that skips the block (or adds
only the MLP), attention removal against zeroing every head and b_O, the spec in run_sweep and resuming, Block
Influence against cosines taken from an activation cache, the curves' statistics against numpy; bad input."""

import json

import numpy as np
import pytest
import torch

from conftest import LOGLIK_TOL, count_layouts, text_model
from lens_heads import layer_scores, run_sweep
from lens_heads.ablation.hooks import zero_heads
from lens_heads.ablation.removed_layers import check_layer_order, remove_layers
from lens_heads.ablation.specs import LayerRemoval, StaticAblation, from_dict
from lens_heads.data.items import Item, Task
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.experiments.layer_removal import (
    evaluate_specs,
    head_plan,
    random_orders,
    ranking_plans,
    removal_curves,
    removal_plan,
)
from lens_heads.models.loading import tiny_model


def toy_task() -> Task:
    items = [Item("sky", ("The sky is",) * 3, (" blue", " green", " very loud today"), 0),
             Item("water", ("Water is",) * 2, (" wet", " dry and hot"), 1),
             Item("cat", ("A cat likes to",) * 2, (" sleep", " fly"), 0),
             Item("sun", ("The sun rises in the",) * 2, (" east", " west"), 0)]
    return Task(name="toy", split="test", shots=0, format="cloze", items=items, n_total=len(items), seed=0)


def with_random_biases(model):
    """Every bias random (TransformerLens initialises them at 0, which would hide b_O)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1].startswith("b_"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def logprobs(result) -> np.ndarray:
    return np.concatenate([it.logprobs for it in result.items])


@torch.no_grad()
def skip_by_hand(model, tokens, layer, part):
    """Logits of a forward written out block by block, where ``layer`` adds nothing (``"block"``) or only its MLP,
    which then reads the unchanged stream (``"attention"``)."""
    resid = model.embed(tokens) + (model.pos_embed(tokens) if model.cfg.positional_embedding_type == "standard"
                                   else 0)
    for i, block in enumerate(model.blocks):
        if i != layer:
            resid = block(resid)
        elif part == "attention":
            resid = resid + block.mlp(block.ln2(resid))
    return model.unembed(model.ln_final(resid))


@pytest.mark.floats
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("part", ["attention", "block"])
@torch.no_grad()
def test_removal_equals_a_forward_that_skips_the_layer_by_hand(arch, part):
    model = with_random_biases(tiny_model(arch, seed=3, n_layers=3))
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    for layer in range(3):
        removed = model.run_with_hooks(tokens, fwd_hooks=remove_layers(model, [layer], part=part).hooks)
        torch.testing.assert_close(removed, skip_by_hand(model, tokens, layer, part), atol=1e-5, rtol=1e-5)
    assert (removed - model(tokens)).abs().max() > 1e-2  # the removal changes the output: the check is not empty


@pytest.mark.floats
@torch.no_grad()
def test_attention_removal_is_zeroing_every_head_and_b_O():
    model = with_random_biases(tiny_model("gpt2", seed=4, n_layers=2))
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(1))
    removed = model.run_with_hooks(tokens, fwd_hooks=remove_layers(model, [0], part="attention").hooks)
    heads = zero_heads([(0, h) for h in range(model.cfg.n_heads)])
    only_heads = model.run_with_hooks(tokens, fwd_hooks=heads)
    assert (only_heads - removed).abs().max() > 1e-3  # zeroing z leaves b_O in the stream
    model.blocks[0].attn.b_O.zero_()
    torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=heads), removed, atol=1e-5, rtol=1e-5)


@pytest.mark.floats
@torch.no_grad()
def test_the_removed_blocks_contribution_is_what_it_wrote_to_the_stream():
    """Removing the last block leaves its input: the unablated resid_post minus (resid_post - resid_pre); removing
    the last attention leaves resid_mid - (resid_mid - resid_pre) as the MLP's input."""
    model = with_random_biases(tiny_model("llama", seed=5, n_layers=2))
    tokens = torch.randint(0, model.cfg.d_vocab, (1, 8), generator=torch.Generator().manual_seed(2))
    _, cache = model.run_with_cache(tokens)
    kept = {}
    hooks = remove_layers(model, [1], part="block").hooks + [
        ("blocks.1.hook_resid_post", lambda x, hook: kept.setdefault("post", x)),
        ("blocks.1.hook_resid_mid", lambda x, hook: kept.setdefault("mid", x))]
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    pre, mid, post = (cache[f"blocks.1.hook_resid_{w}"] for w in ("pre", "mid", "post"))
    torch.testing.assert_close(kept["post"], post - (post - pre), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kept["mid"], mid - (mid - pre), atol=1e-5, rtol=1e-5)


@pytest.mark.floats
def test_evaluation_with_a_removed_block_matches_the_hand_forward():
    """Through the evaluator (shared prefixes, fused attention, the shared trunk of evaluate_each): the same
    log-likelihoods as the hand forward that skips the block."""
    model = text_model(n_layers=3)
    task = toy_task()
    result = evaluate(model, task, hooks=[remove_layers(model, [1], part="block")], progress=False, batch_size=3)
    enc = lambda s: model.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    for item, record in zip(task, result.items):
        for choice, (context, continuation) in enumerate(zip(item.contexts, item.continuations)):
            ctx, cont = enc(context), enc(continuation)  # lm-eval rows: no BOS
            tokens = torch.tensor([ctx + cont])
            logp = torch.log_softmax(skip_by_hand(model, tokens, 1, "block")[0].double(), dim=-1)
            expected = sum(logp[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont))
            assert record.logprobs[choice] == pytest.approx(expected, rel=LOGLIK_TOL["rtol"], abs=LOGLIK_TOL["atol"])


@pytest.mark.floats
def test_layer_removal_runs_in_run_sweep_and_resumes(tmp_path):
    model = text_model(n_layers=3)
    task = toy_task()
    specs = [LayerRemoval((2,), part="attention", order="mine"), LayerRemoval((2, 0), part="block", order="mine")]
    sweep = run_sweep(model, task, scores=[], fractions=[0], random_baseline=False, specs=specs, out_dir=tmp_path,
                      progress=False, batch_size=4)
    curves = sweep.curves("layers")
    assert list(curves) == ["mine · attention", "mine · block"]
    unit = curves["mine · block"][-1]
    assert unit.realised_fraction == pytest.approx(2 / 3)
    assert unit.head_share == [[1.0] * 4, [0.0] * 4, [1.0] * 4]
    alone = evaluate(model, task, hooks=[remove_layers(model, [2, 0], part="block")], progress=False)
    np.testing.assert_allclose(logprobs(unit.result), logprobs(alone), **LOGLIK_TOL)  # other batches
    again = run_sweep(model, task, scores=[], fractions=[0], random_baseline=False, specs=specs, out_dir=tmp_path,
                      progress=False, batch_size=4)
    assert again.meta["units_run"] == 0 and again.meta["units_reused"] == 3


def test_a_layer_removal_spec_round_trips_through_json():
    spec = LayerRemoval((3, 1), part="block", order="Block Influence")
    back = from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec and back.ranked_by == "Block Influence · block" and back.target_fraction == 2


@pytest.mark.floats
def test_shared_forwards_give_each_unit_what_it_gives_alone(tmp_path):
    model = text_model(n_layers=4)
    task = toy_task()
    order = [3, 1, 0, 2]
    plans = {"mine": removal_plan(model, order, [1, 2], part="attention", label="mine"),
             "heads": head_plan(model, [(l, h) for l in order for h in range(4)], [1], label="heads")}
    curves = removal_curves(model, task, plans, out_dir=tmp_path, progress=False, batch_size=3, chunk=2)
    for spec in plans["mine"] + plans["heads"]:
        alone = evaluate_each(model, task, [[spec.build(model)]], progress=False, _shared_prefixes=False)[0]
        unit = curves.curves[spec.ranked_by][len(getattr(spec, "layers", ())) or len(spec.heads) // 4]
        np.testing.assert_allclose(logprobs(unit.result), logprobs(alone), **LOGLIK_TOL)
    # zeroing every head of layer 3 = removing its attention (tiny llama has no b_O): 0 @ W_O is 0, the same forward
    np.testing.assert_allclose(curves.values("heads", "kl"), curves.values("mine · attention", "kl")[:1], atol=1e-6)
    stored = sorted(p.name for p in tmp_path.glob("*.json"))
    again = evaluate_specs(model, task, plans["mine"], out_dir=tmp_path, progress=False)
    assert len(again) == 3 and sorted(p.name for p in tmp_path.glob("*.json")) == stored
    # the same layers removed under another ranking's name are the same measurement: nothing new is evaluated
    renamed = evaluate_specs(model, task, [LayerRemoval((3,), part="attention", order="other")], out_dir=tmp_path,
                             progress=False)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == stored
    assert logprobs(renamed[LayerRemoval((3,), part="attention", order="other")].result).tolist() == \
        logprobs(again[plans["mine"][0]].result).tolist()


def test_curve_statistics_are_the_numpy_means_and_paired_differences(tmp_path):
    model = text_model(n_layers=4)
    task = toy_task()
    plans = {s: removal_plan(model, o, [1, 3], part="block", label=s) for s, o in
             (("a", [0, 1, 2, 3]), ("b", [3, 2, 1, 0]))}
    curves = removal_curves(model, task, plans, out_dir=tmp_path, progress=False)
    base = {it.id: it for it in curves.baseline.items}
    kl_by_hand = []
    for unit in curves.curves["a · block"].values():
        row = []
        for it in unit.result.items:
            p = np.exp(base[it.id].logprobs - np.max(base[it.id].logprobs))
            q = np.exp(np.array(it.logprobs) - np.max(it.logprobs))
            p, q = p / p.sum(), q / q.sum()
            row.append(float(np.sum(p * np.log(p / q))))
        kl_by_hand.append(row)
    table = curves.to_dataframe(n_resamples=200).set_index(["curve", "k"])
    np.testing.assert_allclose(table.loc["a · block", "kl"].to_numpy(), np.mean(kl_by_hand, 1), rtol=1e-9)
    assert (table["kl_low"] <= table["kl"]).all() and (table["kl"] <= table["kl_high"]).all()
    diff = curves.difference("a · block", "b · block", "kl", n_resamples=200).set_index("k")
    expected = np.mean(kl_by_hand, 1) - table.loc["b · block", "kl"].to_numpy()
    np.testing.assert_allclose(diff.loc[[1, 3], "difference"].to_numpy(), expected, rtol=1e-9)
    assert diff.loc["mean", "difference"] == pytest.approx(expected.mean())
    same = curves.difference("a · block", "a · block", "kl", n_resamples=200)
    assert (same["difference"] == 0).all() and (same["verdict"] == "cannot tell apart").all()
    curves.mean_of(["a · block", "b · block"], "mean")
    np.testing.assert_allclose(curves.per_item("mean", "kl"),
                               (curves.values("a · block", "kl") + curves.values("b · block", "kl")) / 2)


@pytest.mark.floats
@torch.no_grad()
def test_block_influence_is_one_minus_the_cosine_from_the_cache():
    model = text_model(n_layers=3)
    task = toy_task()
    scores = layer_scores(model, task, progress=False, batch_size=2)
    from lens_heads.data.inputs import tokenize_inputs

    tokens, mask = tokenize_inputs(model, task)
    block, attention = np.zeros(3), np.zeros(3)
    for row, real in zip(tokens, mask):
        _, cache = model.run_with_cache(row[real][None])
        for layer in range(3):
            pre, mid, post = (cache[f"blocks.{layer}.hook_resid_{w}"][0].double() for w in ("pre", "mid", "post"))
            cos = lambda a, b: (a * b).sum(-1) / a.norm(dim=-1) / b.norm(dim=-1)  # noqa: E731
            block[layer] += float((1 - cos(pre, post)).sum())
            attention[layer] += float((1 - cos(pre, mid)).sum())
    # float32 cosines (sums over d_model = 64) against float64 ones of the same float32 activations: ~1e-6 of 1
    np.testing.assert_allclose(scores.block_influence, block / int(mask.sum()), rtol=1e-4)
    np.testing.assert_allclose(scores.attention_influence, attention / int(mask.sum()), rtol=1e-4)
    np.testing.assert_allclose(scores.ahon_ln_mean, 1.0, rtol=1e-5)  # AHON (LN) averages to 1 in every layer
    order = scores.order("Block Influence")
    assert sorted(order) == [0, 1, 2] and list(scores.block_influence[order]) == sorted(scores.block_influence)
    assert scores.order("AHON (LN) zero share")[0] == int(np.argmax(scores.ahon_ln_zero_share))


def test_bad_input_is_refused_with_what_to_give():
    model = tiny_model("llama", n_layers=3)
    with pytest.raises(ValueError, match="removing all 3 layers"):
        remove_layers(model, [0, 1, 2])
    with pytest.raises(ValueError, match="out of range: this model has layers 0..2"):
        remove_layers(model, [3])
    with pytest.raises(ValueError, match="more than once"):
        remove_layers(model, [1, 1])
    with pytest.raises(ValueError, match="is empty"):
        remove_layers(model, [])
    with pytest.raises(ValueError, match="part must be one of"):
        remove_layers(model, [0], part="mlp")
    with pytest.raises(ValueError, match="not a layer index"):
        remove_layers(model, ["1"])
    with pytest.raises(ValueError, match="shape"):
        check_layer_order(np.zeros((3, 1), dtype=int), 3)
    with pytest.raises(ValueError, match="more than once"):
        check_layer_order([0, 0, 1], 3)
    with pytest.raises(ValueError, match="each of the model's layers"):
        check_layer_order([0, 1], 3)
    with pytest.raises(ValueError, match="each of the model's layers"):
        removal_plan(model, [0, 1, 2, 3], [1], label="x")
    with pytest.raises(ValueError, match="from 1 to 2"):
        removal_plan(model, [0, 1, 2], [3], label="x")
    with pytest.raises(ValueError, match="head_order has shape"):
        head_plan(model, [0, 1, 2], [1], label="x")
    with pytest.raises(ValueError, match=r"head_order repeats heads \[\(0, 0\),"):
        head_plan(model, [(0, 0)] * (model.cfg.n_layers * model.cfg.n_heads), [1], label="x")
    with pytest.raises(ValueError, match="specs takes a list"):
        run_sweep(model, toy_task(), scores=[], fractions=[0], specs=LayerRemoval((0,)))
    with pytest.raises(ValueError, match="ablation='zero'"):
        LayerRemoval((0,), ablation="mean")
    with pytest.raises(ValueError, match="takes a Task"):
        layer_scores(model, "arc_easy")
    with pytest.raises(ValueError, match="no items"):
        layer_scores(model, Task(name="empty", split="test", shots=0, format="cloze", items=[], n_total=0, seed=0))
    assert isinstance(head_plan(tiny_model("llama", n_layers=3), [(l, h) for l in range(3) for h in range(4)], [2],
                                label="x")[0], StaticAblation)


def test_the_layers_analysis_end_to_end_on_a_tiny_model(tmp_path):
    """The analysis on a tiny llama (4 layers x 4 heads) and 4 PIQA items, over recorded inputs made for it (a
    sweep's units and per-head effects): every output is written and says what it is; the per-layer removal
    effects are the curves' and the oracle removes the smallest measured effect first."""
    import pandas as pd

    from conftest import load_script
    from lens_heads.sweep.unit_store import save_units

    script = load_script("layers")
    model = text_model(n_layers=4, n_ctx=512)
    fig = tmp_path / "fig"
    args = script.parse_args(["--n", "4", "--counts", "1,2", "--random-seeds", "0,1", "--n-boot", "50",
                              "--out", str(tmp_path / "runs"), "--figures", str(fig), "--no-png"])
    task = script.load_task("piqa", n=4, seed=0)
    sweep = run_sweep(model, task, scores=["AHON (LN)", "AWFT"], fractions=[0, .1, .2, .3], progress=False)
    save_units(sweep, fig / "sweep_piqa_units.json.gz")
    pd.DataFrame([dict(layer=l, head=h, metric=m, method="ablation", mean=0.01 * (l + 1), n=2)
                  for l in range(4) for h in range(4) for m in ("kl", "gold_logprob")]).to_csv(
        fig / "head_effects_piqa.csv", index=False)
    script.run_task(model, "piqa", args)
    names = {p.name for p in fig.iterdir()}
    assert {"layers_piqa.csv", "layers_piqa.html", "layer_removal_piqa.csv", "layer_removal_piqa.html",
            "layer_removal_tests_piqa.csv", "layers_piqa.json"} <= names
    result = json.loads((fig / "layers_piqa.json").read_text())
    assert result["n"] == 4 and result["seed"] == 0 and result["data"]["task"] == "piqa"
    assert result["weight_basis"] == "raw (no weight processing)" and result["protocol"] == "lm-eval"
    per_layer = pd.read_csv(fig / "layers_piqa.csv")
    assert per_layer["summed_head_kl"].tolist() == pytest.approx([0.04, 0.08, 0.12, 0.16])
    shares = per_layer[["zeroed_30%_AHON (LN)", "zeroed_30%_AWFT"]].to_numpy()
    assert ((shares >= 0) & (shares <= 1)).all()
    curves = pd.read_csv(fig / "layer_removal_piqa.csv")
    oracle = result["orders"]["attention"]["oracle (measured layer effect)"]
    assert per_layer.set_index("layer").loc[oracle, "attention_kl"].is_monotonic_increasing
    first = curves[(curves["ranking"] == "oracle (measured layer effect)") & (curves["part"] == "attention")
                   & (curves["k"] == 1)]
    assert first["kl"].iloc[0] == pytest.approx(per_layer["attention_kl"].min())
    assert {"random", "random seed", "oracle", "heads", ""} == set(curves["style"].fillna(""))
    tests = pd.read_csv(fig / "layer_removal_tests_piqa.csv")
    assert {"a", "b", "metric", "k", "difference", "low", "high", "p_value", "p_adjusted", "verdict"} <= set(tests)


def test_report_layers_stage_is_the_librarys_and_resumes(tmp_path):
    """The report's whole-layers stage on a tiny model: its layer scores and curve points are the library's, its
    section renders, and a rerun reads the units from the cache."""
    import pandas as pd

    from lens_heads import load_task
    from lens_heads.heads.scoring import score_heads
    from lens_heads.plumbing.cache import Cache
    from lens_heads.report.config import ReportConfig
    from lens_heads.report.layer_stages import LAYER_COUNTS, layers_stage
    from lens_heads.report.render import render_page
    from lens_heads.report.sections import layers as layers_section

    model = text_model(n_layers=5, n_ctx=512)
    task = load_task("piqa", n=3, seed=0)
    scores = score_heads(model, task, progress=False)
    cache, key, config = Cache(tmp_path), {"model": "tiny-llama"}, ReportConfig(n=3, progress=False)
    result = layers_stage(model, task, scores, config, cache, key)
    fresh = layer_scores(model, task, scores=scores, progress=False)
    np.testing.assert_allclose(result.tables["layer_scores_piqa"]["block_influence"], fresh.block_influence)
    plan = removal_plan(model, fresh.order("attention rank"), LAYER_COUNTS, part="attention", label="attention rank")
    mine = result.tables["layer_removal_piqa"].set_index("curve").loc["attention rank · attention"]
    for spec, (_, row) in zip(plan, mine.iterrows()):
        alone = evaluate(model, task, hooks=[spec.build(model)], progress=False)
        expected = np.mean([float(it.correct()) for it in alone.items])
        assert row["accuracy"] == pytest.approx(expected)
    assert "Whole layers on piqa" in render_page("t", "s", [layers_section(result)])
    stored = sorted(p.name for p in tmp_path.rglob("*.json"))
    again = layers_stage(model, task, scores, config, cache, key)
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == stored
    pd.testing.assert_frame_equal(again.tables["layer_removal_piqa"], result.tables["layer_removal_piqa"])


def test_random_orders_are_seeded_permutations_of_every_layer():
    """The report and analyses/layers.py take their random layer orders from here: per seed, a permutation of every
    layer drawn by numpy's default generator from that seed, named after the seed."""
    orders = random_orders(6, (0, 3))
    assert list(orders) == ["random (seed 0)", "random (seed 3)"]
    for seed, order in zip((0, 3), orders.values()):
        assert sorted(order) == list(range(6)) and all(type(x) is int for x in order)  # plain ints: JSON-ready
        assert order == np.random.default_rng(seed).permutation(6).tolist()
    assert orders["random (seed 0)"] != orders["random (seed 3)"]
    assert random_orders(6, (0,)) == {"random (seed 0)": orders["random (seed 0)"]}  # one seed alone, the same draw


def test_ranking_plans_name_each_plan_by_the_curve_its_removals_make():
    """Each ranking's plan removes the first k layers of its order, its part, and is keyed by the curve name its
    removals carry (the key the report's layers stage and analyses/layers.py look curves up by)."""
    model = text_model(n_layers=4)
    orders = {"mine": [3, 1, 0, 2], **random_orders(4, (5,))}
    plans = ranking_plans(model, orders, [1, 3], part="block")
    assert list(plans) == ["mine · block", "random (seed 5) · block"]
    for (key, plan), order in zip(plans.items(), orders.values()):
        assert [spec.layers for spec in plan] == [tuple(order[:1]), tuple(order[:3])]
        assert {spec.part for spec in plan} == {"block"} and {spec.ranked_by for spec in plan} == {key}


def test_layer_removals_lay_the_weights_out_once_for_all_their_chunks(tmp_path, monkeypatch):
    """Chunk after chunk reuses one packed layout of the gated MLPs and of the attention (the shared-forwards test
    above compares units of later chunks with evaluations that lay them out afresh)."""
    model = text_model(n_layers=3)
    made = count_layouts(monkeypatch)
    specs = [LayerRemoval((layer,), part="attention") for layer in range(3)]
    units = evaluate_specs(model, toy_task(), specs, out_dir=tmp_path, chunk=1, progress=False)
    assert len(units) == 4  # the baseline and three removals, one layout of each weight
    assert made == {"gated": model.cfg.n_layers, "qkv": model.cfg.n_layers, "output": model.cfg.n_layers}
