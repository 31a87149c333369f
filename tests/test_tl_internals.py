"""The TransformerLens internals behind the fast paths (lens_heads.models.tl_internals): each is in the installed
release with the parameters the adapter was written for, and a release that drops or changes one is refused at use,
naming it. Runs in both environments: each checks the internals of its own TransformerLens major."""

import pytest
import torch

from lens_heads.models import tl_internals as tl

MAJOR = tl.tl_major()
HERE = sorted(name for name, internal in tl.INTERNALS.items() if MAJOR in internal.majors)


def test_the_installed_release_is_the_one_the_internals_were_checked_against():
    assert tl.tl_version().startswith(tl.CHECKED[MAJOR] + "."), (
        f"TransformerLens {tl.tl_version()} is installed; tl_internals.INTERNALS describes {tl.CHECKED[MAJOR]}: read "
        "the new release's source for every internal listed there (and the instance attributes in ATTRIBUTES), "
        "update them, then CHECKED")


@pytest.mark.parametrize("name", HERE)
def test_each_internal_is_there_with_the_expected_parameters(name):
    assert tl.check(name) is None, tl.check(name)


@pytest.mark.parametrize("feature", sorted({f for name in HERE for f in tl.INTERNALS[name].features}))
def test_each_feature_is_allowed_on_the_installed_release(feature):
    tl.require(feature)


# ---------------------------------------------------------------- HookedTransformer (TransformerLens 3.9)

hooked = pytest.mark.skipif(MAJOR >= 4, reason="HookedTransformer's internals: TransformerLens 3.9 (.venv)")


@pytest.fixture
def llama():
    from lens_heads.models.loading import tiny_model

    return tiny_model("llama", n_ctx=32)


@hooked
def test_the_attribute_readers_reach_every_module_attribute_listed(llama):
    """ATTRIBUTES lists what the adapter reads from module instances; each is on the tiny llama's modules."""
    modules = {"AbstractAttention": llama.blocks[0].attn, "GatedMLP": llama.blocks[0].mlp}
    for owner, names in tl.ATTRIBUTES.items():
        assert isinstance(modules[owner], tl.load(f"transformer_lens.components:{owner}"))
        for name in names:
            assert hasattr(modules[owner], name), f"{owner} has no {name}"
    assert tl.is_plain_gated_mlp(llama.blocks[0].mlp) and tl.is_plain_unembed(llama.unembed)
    assert type(llama.blocks[0].attn) in tl.ATTENTION_CLASSES


@hooked
def test_rotary_at_explicit_positions_is_apply_rotary(llama):
    """At positions 0..n-1 the adapter's per-row rotary is TransformerLens's own apply_rotary: the same elementwise
    products and sums of the same table entries, so equal to the bit (no tolerance)."""
    attn = llama.blocks[0].attn
    x = torch.randn(2, 5, attn.cfg.n_heads, attn.cfg.d_head, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5)[None].expand(2, -1)
    torch.testing.assert_close(tl.rotary_at(attn, x, positions), attn.apply_rotary(x), rtol=0, atol=0)
    later = tl.rotary_at(attn, x[:, :1], positions[:, 3:4])  # one token at position 3, as a shared prefix's suffix
    whole = attn.apply_rotary(torch.cat([x[:, :3], x[:, :1]], dim=1))  # the same token as the fourth of a row
    torch.testing.assert_close(later, whole[:, 3:4], rtol=0, atol=0)


@hooked
def test_a_changed_internal_is_refused_at_use_naming_it(llama, monkeypatch):
    from lens_heads.evaluation.fused_attention import fused_attention
    from lens_heads.evaluation.packed_weights import packed_weights

    tl.require.cache_clear()  # a feature's success is kept for the process: forget it for the patched release
    abstract = tl.load("transformer_lens.components.abstract_attention:AbstractAttention")
    monkeypatch.setattr(abstract, "apply_rotary", lambda self, x, offset=0, mask=None, extra=None: x)
    with pytest.raises(tl.InternalsChanged, match=r"AbstractAttention\.apply_rotary takes \(self, x, offset, mask, "
                                                  r"extra\).*attention='eager'"):
        with fused_attention(llama):
            pass
    monkeypatch.delattr(abstract, "rotate_every_two")
    with pytest.raises(tl.InternalsChanged, match=r"AbstractAttention\.rotate_every_two \(.*\) is gone"):
        tl.require(tl.FUSED_ATTENTION)
    unembed = tl.load("transformer_lens.components:Unembed")
    monkeypatch.setattr(unembed, "forward", lambda self, residual, scale: residual)
    with pytest.raises(tl.InternalsChanged, match=r"packed weights .*Unembed\.forward takes \(self, residual, scale\)"):
        with packed_weights(llama):
            pass


@hooked
def test_a_missing_module_attribute_is_named_when_read(llama):
    from lens_heads.evaluation.fused_attention import fused_attention

    del llama.blocks[1].attn._attention_dir_override
    with fused_attention(llama), pytest.raises(tl.InternalsChanged, match=r"Attention has no _attention_dir_override"):
        llama(torch.tensor([[1, 2, 3]]))


# ---------------------------------------------------------------- private names stay behind the adapter


def test_only_the_adapter_calls_transformer_lens_loading_from_pretrained():
    """``transformer_lens.loading_from_pretrained`` is gone in TransformerLens 4: only this adapter may reach it, so
    its absence is named by ``require`` instead of failing as an import error in the middle of a load."""
    from pathlib import Path

    import lens_heads

    root = Path(lens_heads.__file__).parent
    imports = ("loading_from_pretrained import", "import transformer_lens.loading_from_pretrained")
    callers = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p.name != "tl_internals.py" and any(i in p.read_text() for i in imports)]
    assert callers == []
    assert {"get_pretrained_state_dict", "get_pretrained_model_config", "get_official_model_name"} <= set(
        name for name, internal in tl.INTERNALS.items() if tl.LOADING in internal.features)


def test_no_module_reads_torch_private_hook_dicts():
    """Whether a hook point is hooked is asked one public way (``lens_heads.models.capture.any_hooked``)."""
    from pathlib import Path

    import lens_heads

    root = Path(lens_heads.__file__).parent
    private = ("._forward_hooks", "._forward_pre_hooks", "._backward_hooks")
    assert [str(p.relative_to(root)) for p in root.rglob("*.py") if any(n in p.read_text() for n in private)] == []


@hooked
def test_any_hooked_sees_a_hook_added_through_transformer_lens(llama):
    from lens_heads.models.capture import any_hooked

    points = [llama.blocks[0].attn.hook_pattern, llama.blocks[1].attn.hook_z]
    assert not any_hooked(points)
    with llama.hooks(fwd_hooks=[("blocks.1.attn.hook_z", lambda z, hook: z)]):
        assert any_hooked(points) and not any_hooked(points[:1])
    with llama.hooks(bwd_hooks=[("blocks.0.attn.hook_pattern", lambda g, hook: g)]):
        assert any_hooked(points[:1])
    assert not any_hooked(points)
