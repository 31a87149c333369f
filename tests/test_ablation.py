"""Ablation hooks: exact removal of a head's contribution, per-input threshold zeroing, random draws, mean-ablation.

Every expectation is computed here from cached activations and the weights, without the hooks under test.
"""

import numpy as np
import pytest
import torch
from transformer_lens.utils import get_act_name

from conftest import ACTIVATION_REL, assert_close_to_scale
from lens_heads.ablation.hooks import mean_z, static_zeroing, threshold_zeroing, zero_heads
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.models.loading import tiny_model

ARCHS = ["gpt2", "llama"]


def _tokens(model, n=6, width=12, seed=0):
    """Random tokens, right-padded with junk to lengths between 4 and ``width``; mask True at real tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.cfg.d_vocab, (n, width), generator=g)
    lengths = torch.randint(4, width + 1, (n,), generator=g)
    lengths[0] = width
    mask = torch.arange(width)[None] < lengths[:, None]
    return tokens, mask


def _cache(model, tokens, mask, names, hooks=()):
    store = {}

    def keep(x, hook):
        store[hook.name] = x.detach().clone()

    with torch.no_grad():
        model.run_with_hooks(tokens, attention_mask=mask.long(), return_type=None,
                             fwd_hooks=list(hooks) + [(n, keep) for n in names])
    return store


@pytest.mark.floats
@pytest.mark.parametrize("arch", ARCHS)
def test_zeroing_a_head_changes_attn_out_by_minus_its_contribution(arch):
    model = tiny_model(arch, seed=1)
    tokens, mask = _tokens(model)
    layer, head = 1, 2
    names = [get_act_name("z", layer), get_act_name("attn_out", layer)]
    base = _cache(model, tokens, mask, names)
    ablated = _cache(model, tokens, mask, [get_act_name("attn_out", layer)], hooks=zero_heads([(layer, head)]))
    contribution = base[names[0]][:, :, head] @ model.W_O[layer, head].detach()  # z_h @ W_O[h], [b, p, d_model]
    assert contribution.abs().max() > 1e-3  # the head does contribute something
    # a difference of two attn_out sums: its rounding is a fraction of attn_out's scale, not of the contribution
    assert_close_to_scale(ablated[names[1]] - base[names[1]], -contribution, scale=base[names[1]])


@pytest.mark.floats
@pytest.mark.parametrize("arch", ARCHS)
def test_mean_ablation_replaces_z_with_its_calibration_mean(arch):
    model = tiny_model(arch, seed=2)
    tokens, mask = _tokens(model, n=5)
    cache = _cache(model, tokens, mask, [get_act_name("z", l) for l in range(model.cfg.n_layers)])
    means = mean_z(model, tokens, attention_mask=mask, batch_size=2)
    for l in range(model.cfg.n_layers):  # explicit masked mean over real positions
        z = cache[get_act_name("z", l)][mask]  # [real positions, head, d_head]
        assert_close_to_scale(means[l], z.mean(0), scale=z)  # a float32 mean of z, summed in batches of 2 rows
    layer, head = 0, 1
    names = [get_act_name("z", layer), get_act_name("attn_out", layer)]
    base = _cache(model, tokens, mask, names)
    ablated = _cache(model, tokens, mask, [names[1]], hooks=zero_heads([(layer, head)], ablation="mean", means=means))
    delta = (means[layer, head] - base[names[0]][:, :, head]) @ model.W_O[layer, head].detach()
    assert_close_to_scale(ablated[names[1]] - base[names[1]], delta, scale=base[names[1]])


def test_static_zeroing_counts_its_share_and_composes_with_the_scoring_pass():
    from lens_heads.heads.scoring import score_heads

    model = tiny_model("llama", seed=3)
    tokens, mask = _tokens(model, n=4)
    heads = [(0, 1), (1, 0), (1, 3)]
    zeroing = static_zeroing(model, heads)
    scores = score_heads(model, tokens, attention_mask=mask, hooks=zeroing.hooks, progress=False)
    ahon = scores.score("AHON")  # the zeroing runs before the scoring hook on hook_z: zeroed heads output nothing
    for layer, head in heads:
        assert torch.all(ahon[:, layer, head] == 0)
    assert (ahon > 0).sum() == ahon.numel() - len(heads) * tokens.shape[0]
    assert zeroing.share_zeroed() == pytest.approx(len(heads) / (model.cfg.n_layers * model.cfg.n_heads))


def _explicit_scores(name, pattern, v, z, mask, n_heads, W_O=None):
    """The few scores this test needs, straight from their definitions (GQA expanded by repeat_interleave; the
    full-head-output norm through each head's slice of ``W_O`` [head, d_head, d_model], multiplied out)."""
    v = v.repeat_interleave(n_heads // v.shape[2], dim=2)
    m = mask.float()
    n = m.sum(1)[:, None]
    last = mask.sum(1) - 1
    ahon = torch.einsum("bph,bp->bh", z.norm(dim=-1), m) / n
    lthon = z[torch.arange(z.shape[0]), last].norm(dim=-1)
    values = {
        "AWFT": torch.einsum("bhp,bp->bh", pattern[..., 0], m) / n,
        "AVVN": torch.einsum("bph,bp->bh", v.norm(dim=-1), m) / n,
        "AHON": ahon,
        "AHON (LN)": ahon / ahon.mean(1, keepdim=True),
        "LTHON (LN)": lthon / ahon.mean(1, keepdim=True),
        "LTHON (HN)": lthon / ahon,
    }
    if W_O is not None:  # the authors' FullHeadOutput(Normalized): o_i W_O[h] in d_model, mean norm over positions
        full = torch.einsum("bph,bp->bh", torch.einsum("bphd,hdm->bphm", z, W_O).norm(dim=-1), m) / n
        values.update({"AHON (full)": full, "AHON (full, LN)": full / full.mean(1, keepdim=True)})
    return values[name]


@pytest.mark.floats
@pytest.mark.parametrize("arch,name", [("gpt2", "AHON (LN)"), ("llama", "AWFT"), ("llama", "LTHON (LN)"),
                                       ("llama", "AVVN"), ("llama", "LTHON (HN)"), ("gpt2", "AHON (full)"),
                                       ("llama", "AHON (full, LN)")])
def test_threshold_zeroing_matches_a_layer_by_layer_explicit_computation(arch, name):
    model = tiny_model(arch, seed=4, n_layers=3)
    tokens, mask = _tokens(model, n=8, seed=5)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    direction = ">" if name == "AWFT" else "<"
    acts = [get_act_name(a, l) for l in range(L) for a in ("pattern", "v", "z")]
    base = _cache(model, tokens, mask, acts)
    W_O = model.W_O.detach()
    pooled = torch.cat([_explicit_scores(name, base[get_act_name("pattern", l)], base[get_act_name("v", l)],
                                         base[get_act_name("z", l)], mask, H, W_O[l]).flatten() for l in range(L)])
    threshold = float(pooled.quantile(0.65 if direction == ">" else 0.35))

    # Explicit: decide layer l on a forward that ablates the decisions already made for layers < l.
    decided = torch.zeros(tokens.shape[0], L, H, dtype=torch.bool)

    def ablate(layer):
        return lambda z, hook: z * ~decided[:, layer][:, None, :, None]

    for l in range(L):
        hooks = [(get_act_name("z", k), ablate(k)) for k in range(l)]
        cache = _cache(model, tokens, mask, [get_act_name(a, l) for a in ("pattern", "v", "z")], hooks=hooks)
        s = _explicit_scores(name, cache[get_act_name("pattern", l)], cache[get_act_name("v", l)],
                             cache[get_act_name("z", l)], mask, H, W_O[l])
        # no score within float32 rounding of the threshold (the hook computes it in its own order)
        assert (s - threshold).abs().min() > ACTIVATION_REL * s.abs().max()
        decided[:, l] = s > threshold if direction == ">" else s < threshold

    zeroing = threshold_zeroing(model, name, threshold)
    seen_z = {}
    check = [(get_act_name("z", l), lambda z, hook: seen_z.__setitem__(hook.layer(), z.detach().clone()))
             for l in range(L)]
    with zeroing.batch(mask, first=0), torch.no_grad():
        model.run_with_hooks(tokens, attention_mask=mask.long(), fwd_hooks=zeroing.hooks + check, return_type=None)
    got = zeroing.zeroed()
    assert 0 < int(decided.sum()) < decided.numel()
    assert torch.equal(got, decided)
    assert zeroing.share_zeroed() == pytest.approx(decided.float().mean(dim=(0, 2)).mean().item())
    for l in range(L):  # the hook after the zeroing sees exactly the zeroed heads at zero, at every position
        is_zero = (seen_z[l] == 0).all(dim=-1).all(dim=1)  # [batch, head]
        assert torch.equal(is_zero, decided[:, l])


@pytest.mark.floats
def test_threshold_zeroing_ignores_padding():
    from lens_heads.heads.scoring import score_heads

    model = tiny_model("gpt2", seed=6)
    tokens, mask = _tokens(model, n=6, seed=7)
    ahon_ln = score_heads(model, tokens, attention_mask=mask, progress=False).score("AHON (LN)")
    assert (ahon_ln - 1.0).abs().min() > ACTIVATION_REL  # no decision hangs on padding's float32 rounding
    junk = tokens.clone()
    junk[~mask] = (junk[~mask] + 11) % model.cfg.d_vocab  # different padding content, same real tokens
    runs = []
    for t in (tokens, junk):
        zeroing = threshold_zeroing(model, "AHON (LN)", 1.0)
        with zeroing.batch(mask, first=0), torch.no_grad():
            model.run_with_hooks(t, attention_mask=mask.long(), fwd_hooks=zeroing.hooks, return_type=None)
        runs.append(zeroing.zeroed())
    assert torch.equal(runs[0], runs[1])
    # and one input alone (no padding at all) gets the decisions it gets inside the padded batch
    i = int(torch.argmin(mask.sum(1)))
    alone = threshold_zeroing(model, "AHON (LN)", 1.0)
    with torch.no_grad():
        model.run_with_hooks(tokens[i:i + 1, :int(mask[i].sum())], fwd_hooks=alone.hooks, return_type=None)
    assert torch.equal(alone.zeroed()[0], runs[0][i])


def test_batch_mask_of_the_wrong_shape_is_an_error():
    model = tiny_model("gpt2")
    tokens, mask = _tokens(model, n=3)
    zeroing = threshold_zeroing(model, "AHON", 0.5)
    with pytest.raises(ValueError, match="attention mask"):
        with zeroing.batch(mask[:, :-1], first=0), torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=zeroing.hooks, return_type=None)


def test_random_zeroing_rate_determinism_batch_independence_and_nesting():
    model = tiny_model("llama", seed=0, n_layers=3)
    tokens = torch.randint(0, model.cfg.d_vocab, (48, 6), generator=torch.Generator().manual_seed(0))

    def run(p, seed, batch):
        zeroing = random_zeroing(model, p, seed)
        with torch.no_grad():
            for start in range(0, tokens.shape[0], batch):
                with zeroing.batch(first=start):
                    model.run_with_hooks(tokens[start:start + batch], fwd_hooks=zeroing.hooks, return_type=None)
        return zeroing

    a, b, c = run(0.3, 1, 8), run(0.3, 1, 5), run(0.3, 2, 8)
    decisions = a.zeroed()
    n = decisions.numel()
    assert abs(decisions.float().mean().item() - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    assert a.share_zeroed() == pytest.approx(decisions.float().mean().item())
    assert torch.equal(decisions, b.zeroed())  # draws are per input, not per batch
    assert not torch.equal(decisions, c.zeroed())
    bigger = run(0.5, 1, 8).zeroed()
    assert torch.all(bigger | ~decisions)  # nested: everything zeroed at p=.3 is zeroed at p=.5


def test_random_zeroing_uses_the_given_input_ids():
    model = tiny_model("gpt2")
    tokens = torch.randint(0, model.cfg.d_vocab, (4, 5), generator=torch.Generator().manual_seed(1))
    zeroing = random_zeroing(model, 0.5, 3)
    with zeroing.batch(torch.ones(4, 5, dtype=torch.bool), inputs=[7, 7, 9, 9]), torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=zeroing.hooks, return_type=None)
    got = zeroing.zeroed()
    assert torch.equal(got[0], got[1]) and torch.equal(got[2], got[3])  # rows of one input share their draw
    seed_9 = int(np.random.SeedSequence([3, 9]).generate_state(1)[0])  # the documented per-input seed
    expected = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(seed_9)) < 0.5
    assert torch.equal(got[2], expected)

    numbered = random_zeroing(model, 0.5, 3)  # first=8: rows are inputs 8..11, drawn as inputs=[8, 9, 10, 11]
    with numbered.batch(first=8), torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=numbered.hooks, return_type=None)
    assert torch.equal(numbered.zeroed()[1], expected)
    with pytest.raises(ValueError, match="first="):  # outside a batch block the rows' inputs are unknown
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=numbered.hooks, return_type=None)
    with pytest.raises(ValueError, match="not both"):
        with numbered.batch(first=0, inputs=[0, 1, 2, 3]):
            pass


def test_bad_arguments_say_what_to_do():
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match="mean_z"):
        zero_heads([(0, 0)], ablation="mean")
    with pytest.raises(ValueError, match="outside"):
        static_zeroing(model, [(5, 0)])
    with pytest.raises(ValueError, match="unknown score"):
        threshold_zeroing(model, "AHONN", 0.1)
    with pytest.raises(ValueError, match="probability"):
        random_zeroing(model, 1.5, 0)
