"""Choosing a backend on TransformerLens 3.9, the errors around it, and the HookedTransformer reference that the
bridge's agreement tests (``test_bridge.py``, run in the 4.x environment) compare against."""

from types import SimpleNamespace

import pytest

from bridge_agreement import SAME_CODE, assert_agree, compute, read_reference
from lens_heads import load_model, model_meta
from lens_heads.heads.scores import what_still_works
from lens_heads.models.backends import check_attention_hooks, default_backend, tl_major

pytestmark = pytest.mark.skipif(tl_major() >= 4, reason="HookedTransformer side: needs TransformerLens 3.9 (.venv); "
                                                        "the bridge side is tests/test_bridge.py")


def test_default_backend_is_hooked_and_recorded(smollm):
    assert default_backend() == "hooked"
    meta = model_meta(smollm)
    assert meta["backend"] == "hooked" and meta["transformer_lens"].startswith("3.")
    assert meta["weight_basis"].startswith("raw")


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match=r"unknown backend 'hf'.*'hooked', 'bridge'"):
        load_model(backend="hf")


def test_bridge_on_transformer_lens_3_says_how_to_get_4():
    with pytest.raises(ValueError, match=r"TransformerLens 4\.x.*setup\.sh --bridge"):
        load_model(backend="bridge")


def test_missing_attention_hook_is_named_with_what_still_works():
    model = SimpleNamespace(hook_dict={"blocks.0.attn.hook_z": None, "blocks.0.attn.hook_v": None},
                            cfg=SimpleNamespace(architecture="MambaForCausalLM"))
    with pytest.raises(ValueError, match=r"\(MambaForCausalLM\) has no blocks\.0\.attn\.hook_pattern") as err:
        check_attention_hooks(model, advice=what_still_works)
    assert "FTVVN, AVVN, LTHON, AHON" in str(err.value) and "AWFT," not in str(err.value)
    with pytest.raises(ValueError, match="Without hook_z no head can be scored or zeroed"):
        check_attention_hooks(SimpleNamespace(hook_dict={}, cfg=SimpleNamespace(architecture="X")),
                              advice=what_still_works)


@pytest.mark.floats  # slow (the embedded model), but the one comparison with values stored on another machine
def test_bridge_reference_is_what_hookedtransformer_computes(smollm):
    """The stored values the bridge is checked against are HookedTransformer's, at the stored thresholds (rewrite
    them with ``python tests/bridge_agreement.py`` when the scores or the evaluator change on purpose)."""
    want, meta = read_reference("smollm2-135m")
    got, _ = compute(smollm, meta["thresholds"])
    assert_agree(got, want, **SAME_CODE)  # stored on another machine: its rounding, not another implementation's
    for name in meta["thresholds"]:  # each zeroing removes some heads, not none or all
        assert 0.05 < float(want[f"zeroed {name}"].float().mean()) < 0.95
