"""The paper's baselines beside Inheritune: hybrid stacking, the half-width warm start, DistilBERT's initialisation,
the distillation loss, and the FLOPs each stage is charged."""

import math

import numpy as np
import pytest
import torch

from conftest import assert_close_to_scale
from lens_heads.growth.gpt2 import GPT2Options, bias_names, gpt2_config, gpt2_model
from lens_heads.growth.inherit import distilbert_init, distilbert_layers, hybrid_stack
from lens_heads.growth.inheritune_config import InherituneConfig, half_width_shape
from lens_heads.growth.inheritune_run import planned_stages, run_inheritune
from lens_heads.growth.widen import widen
from lens_heads.plumbing.errors import InputError
from lens_heads.training.distill import Distillation, DistillConfig, distillation_loss
from test_inheritune import (
    VOCAB,
    corpus,  # noqa: F401  (the fixture)
    perturbed,
    state,
    tiny_gpt2,
    tiny_train_config,
)

OPTIONS = [GPT2Options(), GPT2Options.transformer_lens()]


def gpt2(n_layers, d_model, n_heads, seed=0, options=GPT2Options()):
    return gpt2_model(gpt2_config(n_layers, d_model=d_model, n_heads=n_heads, n_ctx=32, d_vocab=VOCAB), seed=seed,
                      options=options)


def tokens(n=3, length=12, seed=0):
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- hybrid stacking


def test_hybrid_stack_interleaves_trained_and_fresh_blocks():
    source = perturbed(tiny_gpt2(2, seed=0), seed=1)
    hybrid = hybrid_stack(source, 4, seed=6)
    src, hyb, fresh = state(source), state(hybrid), state(tiny_gpt2(4, seed=6))
    for name, tensor in hyb.items():
        if name.startswith("blocks."):
            layer, rest = name.split(".", 2)[1:]
            layer = int(layer)
            if layer in (0, 2):  # source blocks 0 and 1 at even depths
                assert torch.equal(tensor, src[f"blocks.{layer // 2}.{rest}"]), name
            else:  # fresh blocks between them: a fresh 4-layer model's, seed 6
                assert torch.equal(tensor, fresh[name]), name
                if name in dict(hybrid.named_parameters()) and not name.endswith(("b_Q", "b_K", "b_V", "b_O", "b_in",
                                                                                 "b_out")):  # zero biases are equal
                    assert not torch.equal(tensor, src[f"blocks.{(layer - 1) // 2}.{rest}"]), name
        else:  # embeddings and final LayerNorm: the source's
            assert torch.equal(tensor, src[name]), name
    three = state(hybrid_stack(source, 3, seed=6))  # 2 -> 3: source blocks at depths 0 and 1 (i * 3 // 2)
    assert torch.equal(three["blocks.1.attn.W_Q"], src["blocks.1.attn.W_Q"])
    with pytest.raises(InputError, match=r"3\.\.4 for a 2-layer source, got 5"):
        hybrid_stack(source, 5)
    with pytest.raises(InputError, match=r"3\.\.4 for a 2-layer source, got 2"):
        hybrid_stack(source, 2)


# ---------------------------------------------------------------- DistilBERT's initialisation


def test_distilbert_layers_are_evenly_spaced_from_first_to_last():
    assert distilbert_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # the blocks DistilBERT/DistilGPT-2 took from 12
    assert distilbert_layers(8, 4) == [0, 2, 5, 7]
    assert distilbert_layers(5, 5) == [0, 1, 2, 3, 4] and distilbert_layers(4, 1) == [0]


def test_distilbert_init_copies_the_spaced_blocks_and_every_other_tensor():
    reference = perturbed(tiny_gpt2(6, seed=0), seed=1)
    student = distilbert_init(reference, 3, seed=4)
    ref, stu = state(reference), state(student)
    taken = [0, 2, 5]  # round(linspace(0, 5, 3)) = 0, 2.5 -> 2 (half to even), 5
    assert distilbert_layers(6, 3) == taken
    for name, tensor in stu.items():
        if name.startswith("blocks."):
            layer, rest = name.split(".", 2)[1:]
            assert torch.equal(tensor, ref[f"blocks.{taken[int(layer)]}.{rest}"]), name
        else:  # token and position embeddings, final LayerNorm, unembedding bias: all the reference's
            assert torch.equal(tensor, ref[name]), name


# ---------------------------------------------------------------- the half-width warm start


@pytest.mark.floats
@pytest.mark.parametrize("options", OPTIONS, ids=["authors", "tl"])
@pytest.mark.parametrize("heads", [(2, 4), (3, 3)], ids=["heads doubled", "d_head doubled"])
def test_widen_computes_what_the_half_width_source_computes(options, heads):
    """No noise: the wide model's residual stream is the source's twice over and its logits are the source's."""
    source_heads, target_heads = heads
    source = perturbed(gpt2(2, 24, source_heads, options=options), seed=1)
    if not options.bias:  # bias=False: frozen zeros, as training leaves them
        with torch.no_grad():
            for name in bias_names(source):
                dict(source.named_parameters())[name].zero_()
    else:  # perturbed biases too: their doubling is checked as well
        assert any(p.abs().sum() > 0 for n, p in source.named_parameters() if n.endswith("b_Q"))
    wide = widen(source, d_model=48, n_heads=target_heads, seed=3, noise=0.0)
    assert (wide.cfg.d_model, wide.cfg.n_heads, wide.cfg.d_mlp) == (48, target_heads, 192)
    assert wide.cfg.d_head == (12 if target_heads == 4 else 16)
    x = tokens()
    names = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "blocks.1.attn.hook_pattern"]
    with torch.no_grad():  # both in float64, so that what is left is the construction, not float32's summation order
        s_logits, s_cache = source.to(torch.float64).run_with_cache(x, names_filter=names)
        w_logits, w_cache = wide.to(torch.float64).run_with_cache(x, names_filter=names)
    assert s_logits.dtype == w_logits.dtype == torch.float64
    # float64: the wide model sums 2d halved terms where the source sums d, another order: a few 1e-16 of each
    # tensor's scale, compounded over two layers of weights of std ~1 (seen: 7e-15). With d_head doubled, W_Q and W_K
    # were scaled by 2^(-1/4) in float32 before the cast (halving is exact, that factor is not): 6e-8 relative in
    # each, amplified by these weights' attention scores of size ~100 (seen: 5e-7 of the activations' scale)
    rel = 1e-12 if target_heads == 4 else 1e-5
    for name in names[:2]:
        s = s_cache[name]
        assert_close_to_scale(w_cache[name], torch.cat([s, s], -1), rel=rel)
    pattern = s_cache[names[2]]
    expected = torch.cat([pattern, pattern], 1) if target_heads == 4 else pattern  # each head's pattern, twice
    assert_close_to_scale(w_cache[names[2]], expected, rel=rel)
    assert_close_to_scale(w_logits, s_logits, rel=rel)
    if not options.bias:  # the biases the options leave out stay frozen zeros
        for name in bias_names(wide):
            p = dict(wide.named_parameters())[name]
            assert not p.requires_grad and not p.any(), name


def test_widen_noise_goes_to_the_second_copies_only():
    source = perturbed(gpt2(1, 24, 2), seed=1)
    exact, noisy = (state(widen(source, d_model=48, n_heads=4, seed=3, noise=n)) for n in (0.0, 0.01))
    diff = {k: noisy[k] - exact[k] for k in exact if exact[k].is_floating_point()}
    assert torch.equal(diff["blocks.0.attn.W_Q"][:2], torch.zeros_like(diff["blocks.0.attn.W_Q"][:2]))  # heads 0, 1
    # heads 2, 3 (the copies): the sample std of 1,152 normal draws, within 15% (its standard error is 2%)
    assert diff["blocks.0.attn.W_Q"][2:].std().item() == pytest.approx(0.01, rel=0.15)
    assert not diff["blocks.0.mlp.W_in"][:, :96].any() and diff["blocks.0.mlp.W_in"][:, 96:].any()
    assert not diff["embed.W_E"][:, :24].any() and diff["embed.W_E"][:, 24:].any()
    for name in ("blocks.0.ln1.w", "ln_final.w", "unembed.b_U"):  # not weight matrices: exact
        assert not diff[name].any(), name
    again = state(widen(source, d_model=48, n_heads=4, seed=3, noise=0.01))
    assert all(torch.equal(again[k], noisy[k]) for k in noisy)  # the noise is the seed's


def test_widen_refuses_a_source_that_does_not_halve_the_width():
    source = gpt2(1, 24, 2)
    with pytest.raises(InputError, match="target has d_model 64, so the source needs 32, it has 24"):
        widen(source, d_model=64, n_heads=4)
    with pytest.raises(InputError, match="neither twice the source's 2 heads"):
        widen(source, d_model=48, n_heads=6)
    with pytest.raises(InputError, match="noise is a standard deviation"):
        widen(source, d_model=48, n_heads=4, noise=-1)
    assert half_width_shape(1024, 16) == (512, 8) and half_width_shape(1600, 25) == (800, 25)  # medium, XL
    with pytest.raises(InputError, match="d_model=75 is odd"):
        half_width_shape(75, 25)
    with pytest.raises(InputError, match="odd"):
        InherituneConfig(d_model=33, n_heads=3)


# ---------------------------------------------------------------- distillation


def by_hand(s, t, y, T, kd, lm, cos_w, hs=None, ht=None):
    """The loss in float64 numpy, written from the formulas (Hinton et al.; DistilBERT's cosine term)."""
    s, t = s.reshape(-1, s.shape[-1]).astype(np.float64), t.reshape(-1, t.shape[-1]).astype(np.float64)

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    p_t, log_p_t, log_p_s = np.exp(log_softmax(t / T)), log_softmax(t / T), log_softmax(s / T)
    kl = (p_t * (log_p_t - log_p_s)).sum(-1).mean()
    ce = -log_softmax(s)[np.arange(len(s)), y.reshape(-1)].mean()
    total = kd * T**2 * kl + lm * ce
    if cos_w:
        a, b = hs.reshape(-1, hs.shape[-1]).astype(np.float64), ht.reshape(-1, ht.shape[-1]).astype(np.float64)
        cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        total += cos_w * (1 - cos).mean()
    return total


@pytest.mark.floats
@pytest.mark.parametrize("config", [DistillConfig.logit(temperature=2.0, kd_weight=0.3), DistillConfig.distilbert(),
                                    DistillConfig(temperature=0.5, kd_weight=1.0, lm_weight=0.0)],
                         ids=["logit", "distilbert", "soft only"])
def test_distillation_loss_is_the_formula(config):
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 5, 11, generator=g) * 3, torch.randn(2, 5, 11, generator=g) * 3
    y = torch.randint(0, 11, (2, 5), generator=g)
    hs, ht = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    got = distillation_loss(s, t, y, config, hs, ht).item()
    expected = by_hand(s.numpy(), t.numpy(), y.numpy(), config.temperature, config.kd_weight, config.lm_weight,
                       config.cosine_weight, hs.numpy(), ht.numpy())
    assert got == pytest.approx(expected, rel=1e-5)  # float32 log-softmax of logits of size ~10: relative 1e-6


@pytest.mark.floats
def test_distillation_loss_is_zero_for_a_student_equal_to_its_teacher():
    teacher = perturbed(tiny_gpt2(2, seed=0), seed=1)
    student = tiny_gpt2(2, seed=5)
    student.load_state_dict(teacher.state_dict())
    windows = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(1))
    soft_and_cosine = Distillation(teacher, DistillConfig(kd_weight=5.0, lm_weight=0.0, cosine_weight=1.0))
    loss = soft_and_cosine(student, windows)
    # float32: the KL of two equal distributions and 1 - cos(h, h) are rounding only (~1e-7 per position)
    assert abs(loss.item()) < 1e-5
    loss.backward()  # the gradient at a minimum: rounding only, against gradients of ~1 elsewhere (the check below)
    assert max(p.grad.abs().max().item() for p in student.parameters() if p.grad is not None) < 1e-4
    other = Distillation(teacher, DistillConfig.distilbert())(tiny_gpt2(2, seed=5), windows)
    assert other.item() > 0.1


def test_bad_distillation_settings_are_refused():
    with pytest.raises(InputError, match="temperature must be > 0, got 0"):
        DistillConfig(temperature=0)
    with pytest.raises(InputError, match="temperature must be > 0, got -1"):
        DistillConfig.logit(temperature=-1)
    with pytest.raises(InputError, match="not all 0"):
        DistillConfig(kd_weight=0, lm_weight=0)
    with pytest.raises(InputError, match="give 0..1"):
        DistillConfig.logit(kd_weight=1.5)
    with pytest.raises(InputError, match="equal width"):
        distillation_loss(torch.zeros(1, 2, 5), torch.zeros(1, 2, 5), torch.zeros(1, 2, dtype=torch.long),
                          DistillConfig.distilbert(), torch.ones(1, 2, 4), torch.ones(1, 2, 8))


# ---------------------------------------------------------------- the run: every baseline a stage, with its budget


def forward_per_token(n_layers, d_model, seq_len, vocab=VOCAB):
    """Spelled out: Q, K, V, O (4 d^2) and the MLP (2 * d * 4d) per layer, causal attention over T (T + 1) / 2
    pairs twice (QK^T and AV), the unembedding; 2 FLOPs a multiply-add."""
    per_layer = 2 * (4 * d_model**2 + 8 * d_model**2) + 2 * d_model * (seq_len + 1)
    return n_layers * per_layer + 2 * d_model * vocab


@pytest.mark.floats
def test_run_inheritune_trains_every_baseline_with_its_budget(corpus, tmp_path):  # noqa: F811
    cfg = InherituneConfig(ref_layers=4, student_layers=2, grow_by=1, max_layers=2, d_model=32, n_heads=2, n_ctx=32,
                           d_vocab=VOCAB, train_config=tiny_train_config(steps=4, eval_every=2), rank_inputs=2, rank_len=16,
                           seed=0)
    result = run_inheritune(cfg, corpus, out_dir=tmp_path, progress=False)
    names = [s.name for s in result.stages]
    assert names == ["reference_4L", "student_2L", "scratch_2L_1x", "scratch_2L_2x", "later_layers_2L",
                     "attention_only_2L", "mlp_only_2L", "stack_source_1L", "stacking_2L", "hybrid_stacking_2L",
                     "half_width_2L", "half_width_widened_2L", "distill_logit_2L", "distill_distilbert_2L"]
    tokens_seen = 4 * 4 * 16  # steps x batch x seq_len
    by = {s.name: s for s in result.stages}
    for s in result.stages:
        assert s.tokens_seen == tokens_seen * (2 if s.name.endswith("_2x") else 1)
        # integers of at most 1e12 in float64: exact, rel=1e-12 only for the order of the products
        assert s.flops == pytest.approx(3 * forward_per_token(s.n_layers, s.d_model, 16) * s.tokens_seen, rel=1e-12)
        assert len(s.rank["max_rank"]) == s.n_layers and s.method
    assert by["half_width_2L"].d_model == 16 and by["half_width_widened_2L"].d_model == 32
    assert by["half_width_2L"].n_heads == 1 and by["half_width_widened_2L"].n_heads == 2
    teacher = forward_per_token(4, 32, 16) * tokens_seen  # the reference's forward on every training token
    assert by["distill_logit_2L"].teacher_flops == pytest.approx(teacher) == by["distill_distilbert_2L"].teacher_flops
    df = result.to_dataframe().set_index("stage")
    assert df.loc["stacking_2L", "source_flops"] == pytest.approx(by["stack_source_1L"].flops)
    assert df.loc["hybrid_stacking_2L", "source_flops"] == pytest.approx(by["stack_source_1L"].flops)
    assert df.loc["half_width_widened_2L", "total_flops"] == pytest.approx(by["half_width_widened_2L"].flops
                                                                            + by["half_width_2L"].flops)
    assert df.loc["half_width_2L", "source_flops"] == 0  # the authors' half width starts from nothing
    assert df.loc["distill_logit_2L", "total_flops"] == pytest.approx(by["distill_logit_2L"].flops + teacher)
    assert df.loc["student_2L", "source_flops"] == 0 and df.loc["student_2L", "uses_reference"]
    assert not df.loc["half_width_2L", "uses_reference"] and not df.loc["half_width_widened_2L", "uses_reference"]
    assert result.meta["growth"]["grow_from"] == "student"
    from lens_heads.training.checkpoints import load_model_state
    from lens_heads.training.windows import validation_loss

    reference = gpt2(4, 32, 2)  # the DistilBERT student starts from the trained reference's blocks 0 and 3
    load_model_state(reference, tmp_path / "reference_4L" / "final" / "model.safetensors")
    start = validation_loss(distilbert_init(reference, 2, seed=cfg.seed + 2), corpus.val, cfg.train_config)
    # the same function on the same weights (reloaded from safetensors): equal up to float32 rounding of a mean loss
    assert by["distill_distilbert_2L"].history[0]["val_loss"] == pytest.approx(start, rel=1e-6)
    # the distillation runs' folders are claimed with their loss and teacher: another temperature is another run
    import json

    key = json.loads((tmp_path / "distill_logit_2L" / "key.json").read_text())["key"]
    assert key["objective"]["distillation"] == {"temperature": 2.0, "kd_weight": 0.5, "lm_weight": 0.5,
                                                "cosine_weight": 0.0}
    assert key["objective"]["teacher"]["n_layers"] == 4
    assert math.isfinite(df.loc["half_width_widened_2L", "val_loss"])
    plan = planned_stages(cfg).set_index("stage")  # the cost a run is planned at is the cost it was charged
    assert list(plan.index) == names
    for s in result.stages:
        assert plan.loc[s.name, "flops"] == pytest.approx(s.flops, rel=1e-12)
        assert plan.loc[s.name, "teacher_flops"] == pytest.approx(s.teacher_flops, rel=1e-12)


@pytest.mark.floats
def test_growth_keeps_the_trained_student_by_default(corpus, tmp_path, monkeypatch):  # noqa: F811
    """A student worse than its reference grows: the grown stage starts from the trained 1-layer student plus
    reference block 1 (its loss before training is that model's), and says so."""
    from lens_heads.growth import inherit, inheritune_run
    from lens_heads.training.checkpoints import load_model_state
    from lens_heads.training.windows import validation_loss

    train_stage = inheritune_run._Stages.train

    def first_student_loses(self, name, *args, **kw):  # the growth rule then grows, whatever the losses
        stage = train_stage(self, name, *args, **kw)
        if name == "student_1L":
            stage.val_loss = math.inf
        return stage

    monkeypatch.setattr(inheritune_run._Stages, "train", first_student_loses)
    cfg = InherituneConfig(ref_layers=3, student_layers=1, grow_by=1, max_layers=2, d_model=32, n_heads=2, n_ctx=32,
                           d_vocab=VOCAB, train_config=tiny_train_config(steps=4, eval_every=2), rank_inputs=2, rank_len=16,
                           seed=0, baselines=False, ablations=())
    result = run_inheritune(cfg, corpus, out_dir=tmp_path, progress=False)
    grown = result.stage("student_2L")
    assert grown.built_from == ["student_1L", "reference_3L"] and "trained student" in grown.method
    reference, first = gpt2(3, 32, 2), gpt2(1, 32, 2)
    load_model_state(reference, tmp_path / "reference_3L" / "final" / "model.safetensors")
    load_model_state(first, tmp_path / "student_1L" / "final" / "model.safetensors")
    expected = inherit.grow(reference, 2, student=first, seed=cfg.seed + 2)
    re_inherited = inherit.inherit(reference, 2, seed=cfg.seed + 2)
    start = grown.history[0]["val_loss"]  # measured before the grown student's first step
    # the same function on equal weights: float32 rounding of a mean loss at most; a re-inherited start differs
    assert start == pytest.approx(validation_loss(expected, corpus.val, cfg.train_config), rel=1e-6)
    assert start != pytest.approx(validation_loss(re_inherited, corpus.val, cfg.train_config), rel=1e-3)


@pytest.mark.floats
@pytest.mark.parametrize("ablations", [("half_width_widened", "half_width"), ("half_width_widened",)],
                         ids=["both", "widened only"])
def test_half_width_as_the_authors_ran_it(corpus, tmp_path, ablations):  # noqa: F811
    """The authors' half width is a fresh model at half the width: its first validation loss is a fresh model's,
    about ln(vocabulary) (their medium_halfwdth log starts at 10.87, ln 50304 = 10.83). lens_heads' widened variant
    starts where the trained half-width model ended. One half-width model is trained for both."""
    cfg = InherituneConfig(ref_layers=2, student_layers=1, grow_by=1, max_layers=1, d_model=32, n_heads=2, n_ctx=32,
                           d_vocab=VOCAB, train_config=tiny_train_config(steps=6, eval_every=3), rank_inputs=2, rank_len=16,
                           baselines=False, ablations=ablations, seed=0)
    result = run_inheritune(cfg, corpus, out_dir=tmp_path, progress=False)
    by = {s.name: s for s in result.stages}
    half = "half_width_1L" if "half_width" in ablations else "width_source_1L_16d"
    assert [s.name for s in result.stages] == ["reference_2L", "student_1L", half, "half_width_widened_1L"]
    assert list(planned_stages(cfg)["stage"]) == [s.name for s in result.stages]
    assert by[half].kind == ("ablation" if "half_width" in ablations else "width_source")
    assert by[half].d_model == 16 and by[half].built_from == []
    # a fresh tied GPT-2's logits have std about 0.02 * sqrt(16) = 0.08, so its loss exceeds ln V by about
    # 0.08^2 / 2 = 0.003 (nats); 0.05 absorbs that and the validation windows' spread
    assert by[half].history[0]["val_loss"] == pytest.approx(math.log(VOCAB), abs=0.05)
    assert by[half].val_loss < by[half].history[0]["val_loss"] - 0.1  # and it trained
    # the widened model computes the trained half-width model's function up to its 1e-3 noise on the second copies
    widened = by["half_width_widened_1L"]
    assert widened.built_from == [half] and widened.d_model == 32
    assert widened.history[0]["val_loss"] == pytest.approx(by[half].val_loss, rel=1e-3)
    assert widened.history[0]["val_loss"] < math.log(VOCAB) - 0.1  # it does not start from scratch


@pytest.mark.floats
def test_a_longer_trained_reference_makes_the_run_grow_and_meta_shows_each_stage(corpus, tmp_path):  # noqa: F811
    """A reference trained 40 steps against students trained 2 steps a stage: the first two students do not match
    it, so the loop grows 1 -> 2 -> 3 layers and stops there (max_layers); ``meta["growth"]["stages"]`` lists each
    stage as it ran, with what the rule did next."""
    cfg = InherituneConfig(ref_layers=4, student_layers=1, grow_by=1, max_layers=3, d_model=32, n_heads=2, n_ctx=32,
                           d_vocab=VOCAB, train_config=tiny_train_config(steps=2, eval_every=2), ref_steps=40, rank_inputs=2,
                           rank_len=16, baselines=True, ablations=(), seed=0)
    result = run_inheritune(cfg, corpus, out_dir=tmp_path, progress=False)
    by = {s.name: s for s in result.stages}
    ref = by["reference_4L"]
    assert ref.steps == 40 and ref.tokens_seen == 40 * 4 * 16 and by["student_1L"].tokens_seen == 2 * 4 * 16
    grown = result.meta["growth"]["stages"]
    assert [g["stage"] for g in grown] == ["student_1L", "student_2L", "student_3L"]
    assert result.meta["growth"]["times_grown"] == 2 and result.final_layers == 3
    last = grown[-1]
    assert [g["then"] for g in grown] == ["grew", "grew", "stopped: matched the reference" if last["matched"] else
                                          "stopped: the deepest student allowed (max_layers)"]
    for g in grown:
        s = by[g["stage"]]
        assert g["matched"] == (s.val_loss <= ref.val_loss)
        assert g["minus_reference"] == s.val_loss - ref.val_loss and len(g["max_rank"]) == g["n_layers"]
    assert not grown[0]["matched"] and not grown[1]["matched"]  # what made it grow
    assert by["scratch_3L_2x"].steps == 4  # the scratch baselines at the students' steps, not the reference's
    plan = planned_stages(cfg).set_index("stage")
    assert list(plan.index) == [s.name for s in result.stages]
    assert plan.loc["reference_4L", "tokens"] == ref.tokens_seen
    with pytest.raises(InputError, match="ref_steps"):
        InherituneConfig(ref_steps=0)
