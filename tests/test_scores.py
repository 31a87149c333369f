"""The twelve head scores against an independent computation.

The reference recomputes attention by hand in float64 from each layer's residual input (``hook_resid_pre``) and the
weights (LayerNorm/RMSNorm, W_Q/W_K/W_V with biases, rotary, causal softmax), one input at a time with no padding,
and evaluates the paper's formulas with explicit loops over heads. It never uses hook_pattern/hook_v/hook_z, the
streaming hooks, expand_kv or lens_heads.heads.scores. The streaming pass (one layer's float32 matmuls, softmax and
norms from the same residual input) must agree on padded batches, right- and left-padded, to 1e-4 relative with a
1e-5 floor for entropies near 0 (differences seen: 1.4e-6 at scores of up to 5; 7e-6 against a float32 reference
under unvectorised CPU kernels).
"""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from lens_heads.data.inputs import tokenize_inputs
from lens_heads.heads.scores import DIRECTION, EXTRA_NAMES, SCORE_NAMES, Score, get_score, scores_of_layer
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.models.capture import any_hooked
from lens_heads.models.embedded import embedded_model_folder
from lens_heads.models.loading import tiny_model
from lens_heads.plumbing.errors import InputError

ATOL, RTOL = 1e-5, 1e-4
AEQD_ATOL = 4e-6  # AEQD's absolute rounding from the fused log-sum-exp (see the padded-batch test)
LENGTHS = (9, 1, 14, 5)  # a one-token input: A[0, 0] = 1, entropy 0, last token = first token


# ---------------------------------------------------------------- independent reference


def reference_head_stats(A, v, z):
    """Paper's formulas on ONE unpadded input: A [head, p, p], v [p, head, d], z [p, head, d] -> dict of [head]."""
    H, p, _ = A.shape
    out = {name: torch.zeros(H, dtype=torch.float64) for name in ["AWFT", "AEQD", "FTVVN", "AVVN", "LTHON", "AHON"]}
    for h in range(H):
        out["AWFT"][h] = sum(A[h, i, 0].item() for i in range(p)) / p
        ent = 0.0
        for i in range(p):
            row = A[h, i].double()
            ent += -(row[row > 0] * row[row > 0].log()).sum().item()
        out["AEQD"][h] = ent / p
        out["FTVVN"][h] = math.sqrt(sum(x * x for x in v[0, h].double().tolist()))
        out["AVVN"][h] = sum(v[j, h].double().norm().item() for j in range(p)) / p
        out["LTHON"][h] = z[p - 1, h].double().norm().item()
        out["AHON"][h] = sum(z[i, h].double().norm().item() for i in range(p)) / p
    return out


def reference_twelve(A, v, z):
    """[head, 12] in SCORE_NAMES order, LN variants by hand (LTHON (LN) over the layer mean of AHON)."""
    base = reference_head_stats(A, v, z)
    ln = {f"{k} (LN)": base[k] / base[k].mean() for k in base}
    ln["LTHON (LN)"] = base["LTHON"] / base["AHON"].mean()
    if (base["AEQD"] == 0).all():  # one-token input: 0/0, defined as 1 (all heads tie)
        ln["AEQD (LN)"] = torch.ones_like(base["AEQD"])
    table = {**base, **ln}
    return torch.stack([table[name] for name in SCORE_NAMES], dim=-1)


def rope(x, rotary_dim, base):
    """GPT-NeoX / Llama rotary on [p, head, d]: rotate halves of the first rotary_dim dims by position."""
    p = x.shape[0]
    inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = torch.arange(p, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().repeat(1, 2)[:, None, :], ang.sin().repeat(1, 2)[:, None, :]
    xr, xp = x[..., :rotary_dim].double(), x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return torch.cat([(xr * cos + rotated * sin).to(x.dtype), xp], dim=-1)


def reference_attention(model, tokens):
    """Per layer (A [head, p, p], v [p, head, d], z [p, head, d]) for one unpadded input, computed by hand."""
    cfg = model.cfg
    sd = {name: w.double() if w.is_floating_point() else w for name, w in model.state_dict().items()}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("hook_resid_pre"))
    layers = []
    for l in range(cfg.n_layers):
        x = cache[f"blocks.{l}.hook_resid_pre"][0].double()
        if cfg.normalization_type == "LN":
            x = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + cfg.eps).sqrt()
            x = x * sd[f"blocks.{l}.ln1.w"] + sd[f"blocks.{l}.ln1.b"]
        else:
            x = x / (x.pow(2).mean(-1, keepdim=True) + cfg.eps).sqrt() * sd[f"blocks.{l}.ln1.w"]
        a = f"blocks.{l}.attn."
        W_K, b_K = (sd[a + "_W_K"], sd[a + "_b_K"]) if a + "_W_K" in sd else (sd[a + "W_K"], sd[a + "b_K"])
        W_V, b_V = (sd[a + "_W_V"], sd[a + "_b_V"]) if a + "_W_V" in sd else (sd[a + "W_V"], sd[a + "b_V"])
        n_kv = W_K.shape[0]
        group = cfg.n_heads // n_kv
        p = x.shape[0]
        A = torch.zeros(cfg.n_heads, p, p, dtype=torch.float64)
        v = torch.zeros(p, cfg.n_heads, cfg.d_head, dtype=torch.float64)
        z = torch.zeros(p, cfg.n_heads, cfg.d_head, dtype=torch.float64)
        for h in range(cfg.n_heads):
            kv = h // group  # the query head's key/value group
            q_h = x @ sd[a + "W_Q"][h] + sd[a + "b_Q"][h]
            k_h = x @ W_K[kv] + b_K[kv]
            v_h = x @ W_V[kv] + b_V[kv]
            if cfg.positional_embedding_type == "rotary":
                q_h = rope(q_h[:, None], cfg.rotary_dim, cfg.rotary_base)[:, 0]
                k_h = rope(k_h[:, None], cfg.rotary_dim, cfg.rotary_base)[:, 0]
            logits = q_h @ k_h.T / math.sqrt(cfg.d_head)
            logits = logits.masked_fill(torch.ones(p, p, dtype=torch.bool).triu(1), float("-inf"))
            A[h] = logits.softmax(-1)
            v[:, h] = v_h
            z[:, h] = A[h] @ v_h
        layers.append((A, v, z))
    return layers


def reference_scores(model, tokens):
    """[layer, head, 12] for one unpadded input."""
    return torch.stack([reference_twelve(*lay) for lay in reference_attention(model, tokens)]).float()


# ---------------------------------------------------------------- models and inputs


def perturbed(arch, seed=0):
    """A tiny random model with non-trivial biases and norm weights, and sharper attention than at init."""
    model = tiny_model(arch, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("b_Q", "b_K", "b_V", "ln1.w", "ln1.b")):
                param.add_(0.3 * torch.randn(param.shape, generator=g))
            if name.endswith(("W_Q", "W_K")):
                param.mul_(4.0)
    return model


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request):
    return perturbed(request.param)


def sequences(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.cfg.d_vocab, (n,), generator=g) for n in LENGTHS]


def padded(seqs, side, pad=0):
    width = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), width), pad)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        sl = slice(0, len(s)) if side == "right" else slice(width - len(s), width)
        tokens[i, sl], mask[i, sl] = s, True
    return tokens, mask


# ---------------------------------------------------------------- the twelve scores


@pytest.mark.floats
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("batch_size", [4, 3])
def test_padded_batch_matches_reference_on_each_input_alone(model, side, batch_size):
    seqs = sequences(model)
    tokens, mask = padded(seqs, side, pad=7)
    result = score_heads(model, tokens, attention_mask=mask, batch_size=batch_size, progress=False)
    assert result.values.shape == (len(seqs), model.cfg.n_layers, model.cfg.n_heads, 12)
    assert result.names == SCORE_NAMES
    aeqd, aeqd_ln = SCORE_NAMES.index("AEQD"), SCORE_NAMES.index("AEQD (LN)")
    for i, s in enumerate(seqs):
        want, got = reference_scores(model, s), result.values[i]
        others = [k for k in range(len(SCORE_NAMES)) if k not in (aeqd, aeqd_ln)]
        torch.testing.assert_close(got[..., others], want[..., others], atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"input {i} ({side} padding): {m}")
        # AEQD is log-sum-exp minus q . (mean key), read off the fused attention: a difference of float32 numbers
        # near 10, each rounded to ~1e-6, so its absolute rounding is AEQD_ATOL; AEQD (LN) divides it by its layer's
        # mean AEQD, and with it the rounding (2.1e-5 seen on unvectorised kernels where a layer's mean is ~0.2)
        layer_mean = want[..., aeqd].abs().mean(-1, keepdim=True).clamp_min(1e-3)
        for k, atol in ((aeqd, torch.full_like(layer_mean, AEQD_ATOL)), (aeqd_ln, AEQD_ATOL / layer_mean)):
            excess = (got[..., k] - want[..., k]).abs() - (atol + RTOL * want[..., k].abs())
            assert (excess <= 0).all(), f"input {i} ({side} padding), {SCORE_NAMES[k]}: off by {excess.max():.2e} more"


@pytest.mark.floats
@pytest.mark.parametrize("rows", ["fused", "chunks"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("query_chunk", [1, 3, 64])
def test_scores_by_query_chunks_match_reference_without_any_whole_pattern(model, side, query_chunk, rows,
                                                                          attention_calls, monkeypatch):
    """Chunks of 1 and 3 rows split every input (14 tokens) and cross the padding; 64 holds all rows at once. The
    attention runs fused in every layer (no eager layer, so no [batch, head, query, key] pattern), and the pattern
    scores come from the queries and keys: from one fused attention's log-sum-exp where the device has one that
    returns it (this CPU), else (forced here) a chunk of rows at a time."""
    from lens_heads.heads import attention_rows

    calls = []
    fused = attention_rows.fused_row_statistics
    monkeypatch.setattr(attention_rows, "fused_row_statistics", lambda *a: calls.append(1) or fused(*a))
    if rows == "chunks":
        monkeypatch.setattr(attention_rows, "fused_statistics_apply", lambda source: False)
    seqs = sequences(model, seed=7)
    tokens, mask = padded(seqs, side, pad=7)
    result = score_heads(model, tokens, attention_mask=mask, batch_size=4, progress=False, query_chunk=query_chunk)
    assert attention_calls == {"fused": list(range(model.cfg.n_layers)), "eager": []}
    assert result.meta["query_chunk"] == query_chunk
    assert len(calls) == (model.cfg.n_layers if rows == "fused" else 0)  # one batch: once per layer
    for i, s in enumerate(seqs):
        torch.testing.assert_close(result.values[i], reference_scores(model, s), atol=ATOL, rtol=RTOL,
                                   msg=lambda m: f"input {i} ({side} padding, {rows} of {query_chunk}): {m}")


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "8", None])
def test_a_query_chunk_that_is_not_a_positive_whole_number_is_refused(model, bad):
    from lens_heads import threshold_zeroing

    with pytest.raises(InputError, match="query_chunk must be a positive whole number"):
        score_heads(model, sequences(model), progress=False, query_chunk=bad)
    with pytest.raises(InputError, match="query_chunk must be a positive whole number"):
        threshold_zeroing(model, "AWFT", 0.5, query_chunk=bad)


def test_an_input_longer_than_the_context_is_refused_before_scoring(model):
    too_long = torch.randint(0, model.cfg.d_vocab, (1, model.cfg.n_ctx + 1))
    with pytest.raises(InputError, match=f"{model.cfg.n_ctx + 1} tokens.*context of {model.cfg.n_ctx}.*max_len"):
        score_heads(model, too_long, progress=False)


@pytest.mark.floats
def test_list_of_token_sequences_is_padded_for_you(model):
    seqs = sequences(model, seed=3)
    result = score_heads(model, seqs, batch_size=2, progress=False)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(result.values[i], reference_scores(model, s), atol=ATOL, rtol=RTOL)


@pytest.mark.floats
def test_padding_content_does_not_matter(model):
    seqs = sequences(model, seed=5)
    tokens, mask = padded(seqs, "left")
    a = score_heads(model, tokens, attention_mask=mask, progress=False)
    tokens = tokens.clone()
    tokens[~mask] = torch.randint(0, model.cfg.d_vocab, (int((~mask).sum()),))
    b = score_heads(model, tokens, attention_mask=mask, progress=False)
    torch.testing.assert_close(a.values, b.values, atol=1e-6, rtol=1e-6)  # masked keys weigh exactly 0: the same sums


@pytest.mark.floats
def test_invariants(model):
    seqs = sequences(model, seed=11)
    r = score_heads(model, seqs, progress=False)
    awft = r.score("AWFT")
    assert bool(((awft >= 0) & (awft <= 1 + 1e-6)).all())
    # AEQD is an entropy over at most p keys: between 0 and ln p.
    longest = max(LENGTHS)
    assert bool(((r.score("AEQD") >= -1e-6) & (r.score("AEQD") <= math.log(longest) + 1e-5)).all())
    for name in SCORE_NAMES[6:]:  # float32 means of 4 ratios to their mean: a few u of 1
        if name == "LTHON (LN)":
            continue
        torch.testing.assert_close(r.score(name).mean(-1), torch.ones(len(seqs), model.cfg.n_layers),
                                   atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")
    ratio = r.score("LTHON") / r.score("AHON").mean(-1, keepdim=True)
    torch.testing.assert_close(r.score("LTHON (LN)"), ratio, atol=1e-5, rtol=1e-5)
    # The one-token input attends only to itself.
    one = LENGTHS.index(1)
    torch.testing.assert_close(awft[one], torch.ones_like(awft[one]))
    torch.testing.assert_close(r.score("AEQD")[one], torch.zeros_like(awft[one]), atol=1e-6, rtol=0)
    assert r.direction == DIRECTION
    assert [n for n in SCORE_NAMES if DIRECTION[n] == ">"] == ["AWFT", "AWFT (LN)"]


# ---------------------------------------------------------------- extras and a user's own score


@pytest.mark.floats
def test_extras_match_explicit_W_O_products(model):
    seqs = sequences(model, seed=2)
    tokens, mask = padded(seqs, "right")
    r = score_heads(model, tokens, attention_mask=mask, extras=EXTRA_NAMES, progress=False)
    sd = model.state_dict()
    for i, s in enumerate(seqs):
        for l, (A, v, z) in enumerate(reference_attention(model, s)):
            full = torch.einsum("phd,hdm->phm", z.double(), sd[f"blocks.{l}.attn.W_O"].double()).norm(dim=-1)
            lthon_full, ahon_full = full[-1], full.mean(0)
            base = reference_head_stats(A, v, z)
            expected = {
                "LTHON (HN)": base["LTHON"] / base["AHON"],
                "LTHON (full)": lthon_full,
                "AHON (full)": ahon_full,
                "LTHON (full, LN)": lthon_full / ahon_full.mean(),
                "AHON (full, LN)": ahon_full / ahon_full.mean(),
            }
            for name, want in expected.items():
                torch.testing.assert_close(r.score(name)[i, l], want.float(), atol=ATOL, rtol=RTOL,
                                           msg=lambda m: f"{name} input {i} layer {l}: {m}")
    assert r.values.shape[-1] == 12  # extras stay apart from the twelve


@pytest.mark.floats
def test_a_thirteenth_score_needs_no_change_to_the_pass(model):
    # Max attention weight on any key other than the first, averaged over queries that have one.
    def max_non_first(layer):
        A = layer.pattern.clone()
        A[torch.arange(A.shape[0]), :, :, layer.first] = 0
        return layer.mean_over_positions(A.amax(-1))

    seqs = sequences(model, seed=4)
    r = score_heads(model, seqs, extras=[Score("MAX", "<", max_non_first)], progress=False)
    for i, s in enumerate(seqs):
        for l, (A, _, _) in enumerate(reference_attention(model, s)):
            want = torch.stack([A[h, :, 1:].amax(-1).mean() if len(s) > 1 else torch.tensor(0.0, dtype=A.dtype)
                                for h in range(model.cfg.n_heads)])
            torch.testing.assert_close(r.score("MAX")[i, l], want.float(), atol=ATOL, rtol=RTOL)


def random_layer(seed: int, batch: int = 2, heads: int = 3, pos: int = 4, d_head: int = 5):
    """A random causal pattern [batch, head, pos, pos] with v and z [batch, pos, head, d_head], no padding."""
    g = torch.Generator().manual_seed(seed)
    A = torch.rand(batch, heads, pos, pos, generator=g).tril()
    A = A / A.sum(-1, keepdim=True)
    v, z = torch.randn(batch, pos, heads, d_head, generator=g), torch.randn(batch, pos, heads, d_head, generator=g)
    return A, v, z, torch.ones(batch, pos, dtype=torch.bool)


@pytest.mark.floats
def test_layer_scores_is_pure_and_checks_shapes():
    A, v, z, mask = random_layer(seed=0)
    before = [t.clone() for t in (A, v, z)]
    out = scores_of_layer(A, v, z, mask)
    assert out.shape == (2, 3, 12)
    for t, b in zip((A, v, z), before):
        assert torch.equal(t, b)
    for i in range(2):
        torch.testing.assert_close(out[i], reference_twelve(A[i], v[i], z[i]).float(), atol=ATOL, rtol=RTOL)
    # The causal shortcut (entropy over past keys only, in row chunks) changes nothing on a causal pattern.
    big, vb, zb, mb = random_layer(seed=2, batch=1, heads=2, pos=150)
    torch.testing.assert_close(scores_of_layer(big, vb, zb, mb, causal=True)[0],
                               reference_twelve(big[0], vb[0], zb[0]).float(), atol=ATOL, rtol=RTOL)
    with pytest.raises(ValueError, match="expand KV heads"):
        scores_of_layer(A, v[:, :, :1], z, mask)
    with pytest.raises(ValueError, match="non-padding"):
        scores_of_layer(A, v, z, torch.tensor([[True] * 4, [False] * 4]))


def test_each_of_the_twelve_formulas_has_a_docstring_of_its_own():
    """pdoc and help() show what each score measures and its inactive side, from its own function."""
    from lens_heads.heads.scores import SCORES

    docs = [score.fn.__doc__ or "" for score in SCORES]
    assert len(set(docs)) == 12 and len({score.fn.__name__ for score in SCORES}) == 12
    for score, doc in zip(SCORES, docs):
        assert doc.startswith(score.name + ":"), (score.name, doc[:40])
        side = "*above*" if score.direction == ">" else "*below*"
        assert f"Inactive when the score is {side} the threshold" in " ".join(doc.split()).replace("inactive", "Inactive"), score.name


# ---------------------------------------------------------------- the pass itself


def test_hooks_are_removed_even_when_the_forward_fails(model):
    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        score_heads(model, sequences(model), hooks=[("blocks.1.hook_resid_pre", boom)], progress=False)
    assert not any_hooked(model.hook_dict.values())
    score_heads(model, sequences(model), progress=False)
    assert not any_hooked(model.hook_dict.values())


@pytest.mark.floats
def test_user_hooks_run_before_scoring(model):
    # Zero head 1 of layer 0 on hook_z: its output scores become 0, the value scores do not change.
    def zero_head(z, hook):
        z[:, :, 1] = 0
        return z

    seqs = sequences(model)
    base = score_heads(model, seqs, progress=False)
    ablated = score_heads(model, seqs, hooks=[("blocks.0.attn.hook_z", zero_head)], progress=False)
    assert torch.all(ablated.score("AHON")[:, 0, 1] == 0) and torch.all(ablated.score("LTHON")[:, 0, 1] == 0)
    torch.testing.assert_close(ablated.score("AVVN")[:, 0], base.score("AVVN")[:, 0])


def test_bad_masks_fail_with_a_reason(model):
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5))
    holes = torch.tensor([[True, False, True, True, True], [True] * 5])
    with pytest.raises(ValueError, match="contiguous"):
        score_heads(model, tokens, attention_mask=holes, progress=False)
    with pytest.raises(ValueError, match="shape"):
        score_heads(model, tokens, attention_mask=torch.ones(2, 4, dtype=torch.bool), progress=False)
    with pytest.raises(ValueError, match="no real tokens"):
        score_heads(model, tokens, attention_mask=torch.tensor([[False] * 5, [True] * 5]), progress=False)


def test_results_round_trip_and_tidy_table(model, tmp_path):
    r = score_heads(model, sequences(model), extras=["LTHON (HN)"], progress=False)
    back = HeadScores.load(r.save(tmp_path / "s.safetensors"))
    assert torch.equal(back.values, r.values) and torch.equal(back.extra_values, r.extra_values)
    assert back.names == r.names and back.meta == r.meta and back.extra_names == ["LTHON (HN)"]
    df = r.to_dataframe()
    n, L, H, _ = r.values.shape
    assert len(df) == n * L * H * 13
    row = df[(df["input"] == 2) & (df["layer"] == 1) & (df["head"] == 3) & (df["score"] == "AHON (LN)")]
    assert row.value.item() == pytest.approx(r.values[2, 1, 3, SCORE_NAMES.index("AHON (LN)")].item())
    assert r.meta["model"]["weight_basis"].startswith("raw")
    assert r.meta["data"]["n_tokens"] == sum(LENGTHS)


# ---------------------------------------------------------------- the embedded model vs Hugging Face eager


def test_embedded_model_matches_hugging_face_eager_attention(smollm):
    """Real GQA model, text inputs, padded batch: against HF's own attention weights and v_proj outputs."""
    prompts = ["The capital of France is", "Heads that attend only to the first token may do nothing at all."]
    r = score_heads(smollm, prompts, batch_size=2, progress=False)
    hf = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32,
                                              attn_implementation="eager").eval()
    cfg = smollm.cfg
    group = cfg.n_heads // cfg.n_key_value_heads
    for i, prompt in enumerate(prompts):
        tokens, _ = tokenize_inputs(smollm, prompt)
        assert tokens[0, 0].item() == smollm.tokenizer.bos_token_id
        values = []
        handles = [layer.self_attn.v_proj.register_forward_hook(lambda m, a, o: values.append(o[0]))
                   for layer in hf.model.layers]
        with torch.no_grad():
            out = hf(tokens, output_attentions=True)
        for h in handles:
            h.remove()
        for l in (0, 7, 29):
            A = out.attentions[l][0]
            v = values[l].reshape(-1, cfg.n_key_value_heads, cfg.d_head)[:, [h // group for h in range(cfg.n_heads)]]
            z = torch.einsum("hqk,khd->qhd", A, v)
            # fp32, two implementations: agreement to 2e-4 relative (seen ~1e-5).
            torch.testing.assert_close(r.values[i, l], reference_twelve(A, v, z).float(), atol=2e-4, rtol=2e-4,
                                       msg=lambda m: f"prompt {i} layer {l}: {m}")


# ---------------------------------------------------------------- tokenize_inputs


def test_tokenize_strings_prepends_bos_and_right_pads(smollm):
    texts = ["Hello world", "A longer sentence with several more tokens in it"]
    tokens, mask = tokenize_inputs(smollm, texts)
    tok = smollm.tokenizer
    for i, text in enumerate(texts):
        want = [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)
        n = len(want)
        assert tokens[i, :n].tolist() == want and mask[i, :n].all() and not mask[i, n:].any()
        assert (tokens[i, n:] == tok.pad_token_id).all()
    assert tokens.shape[1] == max(mask.sum(1))


def test_tokenize_task_reads_the_rows_its_evaluation_runs(smollm):
    """lm-eval rows, one per PIQA choice: the tokens of context + answer without the last one, no BOS."""
    from lens_heads import load_task

    task = load_task("piqa", n=3)
    tokens, mask = tokenize_inputs(smollm, task)
    rows = [smollm.tokenizer.encode(c + x, add_special_tokens=False)[:-1]
            for item in task for c, x in zip(item.contexts, item.continuations)]
    alone, alone_mask = tokenize_inputs(smollm, rows)
    assert tokens.shape[0] == 6 and torch.equal(tokens, alone) and torch.equal(mask, alone_mask)


def test_tokenize_limits_and_bad_inputs():
    model = tiny_model("gpt2")  # n_ctx 64, no tokenizer
    too_long = [list(range(10)), list(range(65))]
    with pytest.raises(ValueError, match="input 1 has 65 tokens.*context of 64"):
        tokenize_inputs(model, too_long)
    tokens, mask = tokenize_inputs(model, too_long, max_len=12)
    assert tokens.shape == (2, 12) and tokens[1].tolist() == list(range(12)) and mask.sum(1).tolist() == [10, 12]
    with pytest.raises(ValueError, match="no tokenizer"):
        tokenize_inputs(model, ["text"])
    with pytest.raises(InputError, match="integer ids"):
        tokenize_inputs(model, torch.rand(2, 3))
    with pytest.raises(ValueError, match="no inputs"):
        tokenize_inputs(model, [])


@pytest.mark.floats
def test_scores_declare_what_they_read_and_run_on_just_that():
    """``reads`` is honest: each score computes on only its declared activations (the others None), to the same
    values as with all three; asking for one that isn't given is an error naming it."""
    A, v, z, mask = random_layer(seed=1)
    full = scores_of_layer(A, v, z, mask)
    expected_reads = {"AWFT": {"pattern"}, "AEQD": {"pattern"}, "FTVVN": {"v"}, "AVVN": {"v"}, "LTHON": {"z"},
                      "AHON": {"z"}, "LTHON (LN)": {"z"}}
    for k, name in enumerate(SCORE_NAMES):
        score = get_score(name)
        assert score.reads == expected_reads.get(name, expected_reads.get(name.removesuffix(" (LN)"))), name
        kept = {key: (x if key in score.reads else None) for key, x in (("pattern", A), ("v", v))}
        torch.testing.assert_close(scores_of_layer(kept["pattern"], kept["v"], z, mask, [name])[..., 0], full[..., k])
    with pytest.raises(ValueError, match=r"read \['pattern'\]"):
        scores_of_layer(None, v, z, mask, ["AWFT"])
