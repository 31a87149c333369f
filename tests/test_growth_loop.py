"""The paper's growth loop from a Llama-shaped reference (the embedded SmolLM2's shape), over seeds: the stages it
goes through, the grown student's tensors, the same-FLOPs scratch budget counted from the weights, both rank
aggregations and the per-window losses the paired tests use."""

import json
import math

import pytest
import torch

from lens_heads import tiny_model
from lens_heads.growth.growth_loop import (
    GrowthLoopConfig,
    grow_any,
    planned_loop,
    run_growth_loop,
    same_flops_steps,
    stage_table,
)
from lens_heads.plumbing.errors import InputError
from lens_heads.training.loop import train
from lens_heads.training.windows import eval_windows, window_losses
from test_inheritune import VOCAB, corpus, perturbed, tiny_train_config  # noqa: F401  (corpus: the fixture)


def llama(n_layers=4, seed=0):
    return tiny_model("llama", seed=seed, n_layers=n_layers, d_vocab=VOCAB, n_ctx=32)


def test_grow_any_keeps_the_trained_student_and_appends_the_reference_blocks():
    reference = perturbed(llama(4), seed=1)
    student = perturbed(llama(2, seed=5), seed=2)  # a "trained" 2-layer student: every tensor its own
    grown = grow_any(reference, 3, student, seed=7)
    g, s, r = grown.state_dict(), student.state_dict(), reference.state_dict()
    for name, tensor in g.items():
        if name.startswith("blocks.2."):
            assert torch.equal(tensor, r[name]), name  # the reference's next block
        elif name in s:
            assert torch.equal(tensor, s[name]), name  # everything the student has, final norm included
    assert {"blocks.2.attn._W_K", "blocks.2.mlp.W_gate"} & set(g)
    with pytest.raises(InputError, match="fewer layers"):
        grow_any(reference, 2, student)


def weight_multiplies(model) -> int:
    """Multiply-adds a token's trunk forward does, counted from the model's own weight matrices (GQA's K and V have
    their own, smaller shapes)."""
    mats = ("W_Q", "_W_K", "_W_V", "W_O", "W_in", "W_gate", "W_out")
    return sum(t.numel() for n, t in model.state_dict().items() if n.startswith("blocks.") and n.rsplit(".", 1)[-1]
               in mats)


def test_same_flops_steps_spends_the_students_flops():
    cfg = tiny_train_config(steps=10)
    small, big = llama(1), llama(3)
    T, tokens = cfg.seq_len, cfg.tokens_per_step

    def per_step(m):  # 3 x forward: 2 FLOPs a multiply-add, causal attention, logits
        c = m.cfg
        return 3 * tokens * (2 * weight_multiplies(m) + 2 * c.n_layers * c.n_heads * c.d_head * (T + 1)
                             + 2 * c.d_model * c.d_vocab)
    spent = 10 * per_step(small) + 10 * per_step(big)
    assert same_flops_steps(spent, big.cfg, cfg) == round(spent / per_step(big))
    assert same_flops_steps(1.0, big.cfg, cfg) == 1  # at least one step


@pytest.mark.floats
def test_growth_loop_grows_until_it_matches_or_reaches_max_layers(corpus, tmp_path, monkeypatch):  # noqa: F811
    reference = llama(4)
    train(reference, corpus, tiny_train_config(steps=30, eval_every=0, checkpoint_every=30), progress=False)
    config = GrowthLoopConfig(start_layers=1, grow_by=1, max_layers=3,
                              train_config=tiny_train_config(steps=2, eval_every=2), seeds=(0, 1), rank_inputs=2,
                              rank_len=16, loss_windows=3)
    record = run_growth_loop(reference, corpus, config, out_dir=tmp_path, progress=False)
    by = {(s["seed"], s["name"]): s for s in record["stages"]}
    for seed in (0, 1):
        path = record["growth"][str(seed)]["stages"]
        assert [p["n_layers"] for p in path] == list(range(1, len(path) + 1))
        assert all(p["then"] == "grew" and not p["matched"] for p in path[:-1])
        last = path[-1]
        assert record["growth"][str(seed)]["stopped"] == ("matched the reference" if last["matched"] else
                                                          "reached max_layers (3)")
        assert last["matched"] or last["n_layers"] == 3
        spent = 0.0
        for p in path:
            n = p["n_layers"]
            student, random_, flops = by[seed, f"student_{n}L"], by[seed, f"random_{n}L"], by[seed, f"same_flops_{n}L"]
            assert p["matched"] == (student["val_loss"] <= record["reference"]["val_loss"])
            spent += student["flops"]
            assert random_["steps"] == student["steps"] == 2
            assert flops["steps"] == same_flops_steps(spent, llama(n).cfg, config.train_config)
            if n > 1:  # the grown student carries its earlier stages' training: the same-FLOPs model trains longer
                assert flops["steps"] > student["steps"]
            for s in (student, random_, flops):
                for agg in ("averaged", "per_input"):
                    assert len(s["rank"][agg]["max_rank"]) == n == len(s["rank_at_init"][agg]["max_rank"])
                assert len(s["window_losses"]) == 3 and all(math.isfinite(v) for v in s["window_losses"])
            if n > 1:
                assert student["built_from"] == [f"student_{n - 1}L", "reference"]
    assert any(len(record["growth"][s]["stages"]) > 1 for s in ("0", "1"))  # it grew (what this test is about)
    assert record["reference"]["rank"]["averaged"]["meta"]["mode"] != record["reference"]["rank"]["per_input"]["meta"][
        "mode"]
    # a window's loss, by hand: the mean over its positions of -log softmax at the next token
    windows = eval_windows(corpus.val, 3, config.train_config.seq_len)
    with torch.no_grad():
        logp = torch.log_softmax(reference(windows[:1, :-1]).double(), -1)[0]
    by_hand = -logp[torch.arange(windows.shape[1] - 1), windows[0, 1:]].mean().item()
    # float32 logits against float64 here: relative 1e-5 absorbs the rounding of a mean of ~16 terms
    assert record["reference"]["window_losses"][0] == pytest.approx(by_hand, rel=1e-5)
    assert window_losses(reference, windows) == record["reference"]["window_losses"]
    plan = {r["stage"]: r for r in planned_loop(reference.cfg, config)}  # the cost planned is the cost charged
    assert list(plan)[-3:] == ["student_3L", "random_3L", "same_flops_3L"]  # the costliest case: to max_layers
    for s in record["stages"]:
        assert plan[s["name"]]["steps"] == s["steps"]
        # integers of at most 1e12 in float64: equal up to the order of the products
        assert plan[s["name"]]["flops"] == pytest.approx(s["flops"], rel=1e-12)
    rows = stage_table(record)
    assert len(rows) == len(record["stages"]) and {"lazy_averaged", "lazy_per_input"} <= set(rows[0])
    import lens_heads.growth.growth_loop as loop

    record_path = tmp_path / "growth_loop.json"  # its config as written when the field was named train
    stored = json.loads(record_path.read_text())
    stored["config"] = {("train" if k == "train_config" else k): v for k, v in stored["config"].items()}
    record_path.write_text(json.dumps(stored))
    with monkeypatch.context() as m:  # a repeated run reloads every stage and measures none again
        m.setattr(loop, "both_ranks", lambda *_: pytest.fail("a recorded stage was measured again"))
        again = run_growth_loop(reference, corpus, config, out_dir=tmp_path, progress=False)
    assert again["stages"] == record["stages"] and again["growth"] == record["growth"]
    other = GrowthLoopConfig(**{**vars(config), "loss_windows": 2})  # other settings: everything measured anew
    assert len(run_growth_loop(reference, corpus, other, out_dir=tmp_path, progress=False)["stages"][0][
        "window_losses"]) == 2
    with pytest.raises(InputError, match="max_layers"):
        GrowthLoopConfig(start_layers=5, train_config=config.train_config).check(4)


def test_growth_tests_pair_each_window_and_seed(corpus, tmp_path):  # noqa: F811
    """Two seeds, sizes 1 and 2 reached by both: the window-unit difference is the mean over windows of the
    seed-averaged per-window differences, the seed-unit one the mean of per-seed final-loss differences."""
    import numpy as np

    from lens_heads.growth.growth_calls import growth_tests, shared_sizes

    def stage(seed, kind, n, loss, windows):
        return {"seed": seed, "kind": kind, "n_layers": n, "val_loss": loss, "window_losses": windows}

    rng = np.random.default_rng(0)
    record = {"reference": {"val_loss": 1.0, "window_losses": list(rng.normal(1, 0.1, 4))}, "stages": [],
              "growth": {"0": {"stages": [{"n_layers": 1}, {"n_layers": 2}]}, "1": {"stages": [{"n_layers": 1},
                                                                                              {"n_layers": 2},
                                                                                              {"n_layers": 3}]}}}
    for seed in (0, 1):
        for n in (1, 2, 3):
            for kind, base in (("student", 2.0), ("random", 3.0), ("same_flops", 2.5)):
                record["stages"].append(stage(seed, kind, n, base + seed, list(rng.normal(base + seed, 0.1, 4))))
    assert shared_sizes(record) == [1, 2]
    t = growth_tests(record, n_resamples=200)
    assert len(t) == 2 * 2 * 3  # 2 units x 2 sizes x 3 others
    row = t[(t["unit"] == "training seed") & (t["n_layers"] == 2) & (t["a"] == "same-size random init")].iloc[0]
    assert row["difference"] == pytest.approx(1.0) and row["n"] == 2  # 3 + s - (2 + s)
    w = t[(t["unit"].str.startswith("validation window")) & (t["n_layers"] == 1) & (t["a"] == "the reference")].iloc[0]
    st = [s for s in record["stages"] if s["kind"] == "student" and s["n_layers"] == 1]
    expected = np.mean(record["reference"]["window_losses"]) - np.mean([s["window_losses"] for s in st])
    assert w["difference"] == pytest.approx(expected) and w["n"] == 4
    assert set(t["verdict"]) and all(t["b"] == "Inheritune")


def test_lazy_rank_tests_pair_each_readded_lazy_layer_over_inputs_and_seeds():
    """Reference lazy in layers 2 and 3, students from 2 layers grown to 4 by both seeds: layers 2 and 3 are the
    re-added lazy ones; the input-unit difference is the mean over inputs of the seed-averaged rank differences, the
    seed-unit one the mean of per-seed mean differences, and a rank that rose by 3 on every input is called higher
    over inputs."""
    import numpy as np

    from lens_heads.growth.growth_calls import lazy_rank_tests, readded_lazy_layers

    rng = np.random.default_rng(0)
    n_inputs = 12

    def ranks(n, level):  # [input][layer]: each input's max rank over a layer's heads
        return {"input_layer_max": (level + rng.integers(0, 2, (n_inputs, n))).tolist()}

    reference = {"rank": {"averaged": {"lazy": [False, False, True, True]}, **ranks(4, 1)}}
    record = {"reference": reference, "config": {"start_layers": 2}, "stages": [],
              "growth": {"0": {"stages": [{"n_layers": 2}, {"n_layers": 4}]},
                         "1": {"stages": [{"n_layers": 2}, {"n_layers": 4}]}}}
    for seed in (0, 1):
        for n in (2, 4):
            before = ranks(n, 1)
            after = {"input_layer_max": (np.asarray(before["input_layer_max"]) + 3).tolist()}
            record["stages"].append({"seed": seed, "kind": "student", "n_layers": n, "rank": after,
                                     "rank_at_init": before})
    assert readded_lazy_layers(record) == {4: [2, 3]}
    t = lazy_rank_tests(record, n_resamples=200)
    assert len(t) == 2 * 2 * 2  # 2 units x 2 layers x (at growth, the reference)
    grown = [s for s in record["stages"] if s["n_layers"] == 4]
    after = np.asarray([s["rank"]["input_layer_max"] for s in grown], dtype=float)[:, :, 3]
    ref = np.asarray(reference["rank"]["input_layer_max"], dtype=float)[:, 3]
    row = t[(t["unit"] == "training seed") & (t["layer"] == 3) & (t["b"] == "the reference")].iloc[0]
    assert row["difference"] == pytest.approx(np.mean(after.mean(axis=1) - ref.mean())) and row["n"] == 2
    w = t[(t["unit"].str.startswith("rank input")) & (t["layer"] == 2) & (t["b"] == "at growth")].iloc[0]
    assert w["difference"] == pytest.approx(3.0) and w["n"] == n_inputs and w["verdict"] == "higher"
    record["growth"]["1"]["stages"].pop()  # seed 1 never grew: no size every seed reached above the start
    assert lazy_rank_tests(record, n_resamples=50).empty


def test_a_reference_with_shared_rotary_tables_is_inherited_and_grown():
    """A model loaded from a folder shares one pair of rotary tables over its whole context (here 4,096 rows) while
    a fresh model keeps TransformerLens's per-layer tables: the weights are copied, the tables (computed from the
    config) are not, and the student attends as the reference's first blocks do."""
    from lens_heads.growth.inherit import inherit_first_layers
    from lens_heads.models import tl_internals

    reference = tiny_model("llama", seed=0, n_layers=3, d_vocab=VOCAB, n_ctx=4096)
    tl_internals.share_rotary_tables(reference)
    student = inherit_first_layers(reference, 1, seed=0)
    assert reference.blocks[0].attn.rotary_sin.shape != student.blocks[0].attn.rotary_sin.shape
    grown = grow_any(reference, 2, student, seed=0)
    tokens = torch.randint(0, VOCAB, (1, 12))
    for model in (student, grown):
        for layer in range(model.cfg.n_layers):
            assert torch.equal(model.blocks[layer].attn.W_Q, reference.blocks[layer].attn.W_Q)
        _, ref_cache = reference.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
        # the same weights and positions: the first blocks' outputs agree up to float32 rounding of equal sums
        torch.testing.assert_close(cache["blocks.0.attn.hook_z"], ref_cache["blocks.0.attn.hook_z"], rtol=1e-5,
                                   atol=1e-6)
