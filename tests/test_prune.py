"""prune: a static ablation baked into a Hugging Face folder. The exported folder, run by plain transformers, is
checked against lens_heads' hooked ablation of the same heads and layers on the original model (TransformerLens
hooks on hook_z / hook_attn_out / hook_mlp_out: a separate computation that shares nothing with the weight edit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from families import family_configs
from lens_heads import InputError, load_model
from lens_heads.ablation.hooks import mean_z, static_zeroing
from lens_heads.ablation.prune import first_layers, prune, prune_arguments
from lens_heads.ablation.removed_layers import remove_layers
from lens_heads.ablation.specs import LayerRemoval, RandomAblation, StaticAblation

FAMILIES = family_configs(4)  # model_type: tiny sizes
FAST = ("llama", "qwen2", "gpt2", "gemma3_text")  # the rest run in the full suite
NO_OUTPUT_BIAS = ("qwen2", "mistral", "phi3")  # configs that can't give the attention output a bias
HEADS = [(0, 1), (2, 0), (2, 3), (1, 2)]  # (1, 2) sits in the removed layer


def hf_folder(path, model_type: str, **extra):
    """A random model of ``model_type`` saved as a Hugging Face folder with a word-level tokenizer; norms and
    biases moved off their init so that a misplaced one shows."""
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **FAMILIES[model_type], **extra)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "ln" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(101)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2").save_pretrained(path)
    return path


def hooked_logits(model, tokens, heads, layers, part, ablation="zero", means=None):
    hooks = static_zeroing(model, heads, ablation=ablation, means=means).hooks if heads else []
    hooks += remove_layers(model, layers, part=part).hooks if layers else []
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=hooks)


def exported_logits(folder, tokens):
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return hf(tokens).logits


def families():
    return [pytest.param(t, marks=() if t in FAST else pytest.mark.slow) for t in FAMILIES]


@pytest.mark.parametrize("model_type", families())
def test_exported_folder_equals_the_hooked_static_ablation(model_type, tmp_path):
    folder = hf_folder(tmp_path / "source", model_type)
    model = load_model(str(folder), device="cpu")
    tokens = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(1))  # longer than the windows
    means = mean_z(model, tokens, attention_mask=torch.ones_like(tokens, dtype=torch.bool))
    with torch.no_grad():
        unablated = model(tokens)
    for part in ("attention", "block"):
        for ablation in ("zero", "mean"):
            mean = means if ablation == "mean" else None
            if ablation == "mean" and model_type in NO_OUTPUT_BIAS:
                with pytest.raises(InputError, match=f"a {model_type} config can't give that projection a bias"):
                    prune(model, heads=HEADS, layers=[1], part=part, ablation=ablation, means=mean)
                continue
            pruned = prune(model, heads=HEADS, layers=[1], part=part, ablation=ablation, means=mean)
            out = pruned.save(tmp_path / f"{part}-{ablation}")
            want = hooked_logits(model, tokens, HEADS, [1], part, ablation, mean)
            got = exported_logits(out, tokens)
            # TransformerLens and transformers order the same float32 operations differently (einsum vs matmul,
            # SDPA vs eager softmax); logits are O(1), and differ by ~1e-7 here.
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
            with torch.no_grad():  # the hooks the export says it bakes in are those same hooks
                assert torch.equal(model.run_with_hooks(tokens, fwd_hooks=pruned.hook_pairs(model)), want)
            assert (got - unablated).abs().max() > 1e-2  # the ablation changes the logits: the check can fail
            config = json.loads((out / "config.json").read_text())
            n_key = "n_layer" if model_type == "gpt2" else "num_hidden_layers"
            assert config[n_key] == (3 if part == "block" else 4)
            assert pruned.kept_layers == ((0, 2, 3) if part == "block" else (0, 1, 2, 3))


def test_dropped_blocks_take_their_parameters_and_per_layer_types(tmp_path):
    folder = hf_folder(tmp_path / "source", "gemma3_text")
    source = AutoModelForCausalLM.from_pretrained(folder)
    pruned = prune(str(folder), layers=[0, 3], part="block")
    config = AutoConfig.from_pretrained(pruned.save(tmp_path / "out"))
    assert config.num_hidden_layers == 2 and config.layer_types == ["full_attention", "sliding_attention"]
    per_layer = sum(p.numel() for p in source.model.layers[0].parameters())
    assert sum(p.numel() for p in pruned.hf.parameters()) == sum(p.numel() for p in source.parameters()) - 2 * per_layer
    # the kept layers are the source's layers 1 and 2, weight for weight
    for new, old in enumerate((1, 2)):
        for (name, p), (_, q) in zip(pruned.hf.model.layers[new].named_parameters(),
                                     source.model.layers[old].named_parameters()):
            assert torch.equal(p, q), name
    record = json.loads((tmp_path / "out" / "lens_heads_prune.json").read_text())
    assert record["kept_layers"] == [1, 2] and record["layers"] == [0, 3] and record["part"] == "block"


def test_mean_ablation_folds_the_mean_output_into_the_bias(tmp_path):
    """The bias is checked against the explicit sum over heads of means[l, h] @ W_O[l, h] (float64)."""
    folder = hf_folder(tmp_path / "source", "llama")
    source = AutoModelForCausalLM.from_pretrained(folder)
    means = torch.randn(4, 4, 16, generator=torch.Generator().manual_seed(0))
    pruned = prune(str(folder), heads=[(2, 0), (2, 3)], ablation="mean", means=means)
    W = source.model.layers[2].self_attn.o_proj.weight.detach().double()  # [d_model, head * d_head]
    want = W[:, 0:16] @ means[2, 0].double() + W[:, 48:64] @ means[2, 3].double()
    o_proj = pruned.hf.model.layers[2].self_attn.o_proj
    torch.testing.assert_close(o_proj.bias.double(), want, atol=1e-6, rtol=1e-6)  # float32 storage of the sum
    assert not o_proj.weight[:, 0:16].any() and not o_proj.weight[:, 48:64].any()
    assert torch.equal(o_proj.weight[:, 16:48], source.model.layers[2].self_attn.o_proj.weight[:, 16:48])
    assert not pruned.hf.model.layers[0].self_attn.o_proj.bias.any()  # the biases the config switch added
    assert not pruned.hf.model.layers[0].self_attn.q_proj.bias.any()


@pytest.mark.slow
def test_exported_folder_loads_in_plain_transformers_without_lens_heads(tmp_path):
    folder = hf_folder(tmp_path / "source", "llama")
    model = load_model(str(folder), device="cpu")
    tokens = torch.randint(0, 101, (2, 10), generator=torch.Generator().manual_seed(2))
    out = prune(model, heads=[(0, 0), (3, 2)], layers=[2], part="block").save(tmp_path / "out")
    want = hooked_logits(model, tokens, [(0, 0), (3, 2)], [2], "block")
    save_file({"tokens": tokens, "logits": want.contiguous()}, str(tmp_path / "expected.safetensors"))
    script = (  # -I: no PYTHONPATH, no user site, no working folder; lens_heads blocked outright
        "import sys, json; sys.modules['lens_heads'] = None\n"
        "import torch; from safetensors.torch import load_file\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"hf = AutoModelForCausalLM.from_pretrained({str(out)!r}).eval()\n"
        f"AutoTokenizer.from_pretrained({str(out)!r})\n"
        f"e = load_file({str(tmp_path / 'expected.safetensors')!r})\n"
        "with torch.no_grad(): got = hf(e['tokens']).logits\n"
        "print(json.dumps(dict(diff=(got - e['logits']).abs().max().item(), lens_heads='lens_heads' in "
        "[m.split('.')[0] for m in sys.modules if sys.modules[m] is not None])))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, env=env,
                         cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["lens_heads"] is False
    assert result["diff"] < 2e-5  # as in the in-process comparison: float32 op order, TL vs transformers


@pytest.mark.slow
def test_embedded_model_pruned_equals_its_hooked_ablation(smollm, tmp_path):
    tokens = smollm.to_tokens(["The capital of France is Paris, and the capital of Italy is",
                               "def add(a, b):\n    return a + b"], prepend_bos=False)
    mask = (tokens != smollm.tokenizer.pad_token_id).long()  # right padding: the real positions are compared
    means = mean_z(smollm, ["Some calibration text about nothing in particular.", "Another one."])
    heads = [(3, 1), (10, 4), (10, 7), (20, 0)]
    for part, layers, ablation in (("attention", [5], "zero"), ("block", [12, 25], "zero"), ("block", [12, 25], "mean")):
        mean = means if ablation == "mean" else None
        out = prune(smollm, heads=heads, layers=layers, part=part, ablation=ablation, means=mean).save(tmp_path / f"{part}-{ablation}")
        hf = AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            got = hf(tokens, attention_mask=mask).logits[mask.bool()]
        want = hooked_logits(smollm, tokens, heads, layers, part, ablation, mean)[mask.bool()]
        # 30 layers of float32 in two op orders, logits up to ~37: they differ by ~6e-5 (1e-6 relative)
        torch.testing.assert_close(got, want, atol=5e-4, rtol=1e-5)
        assert hf.config.num_hidden_layers == smollm.cfg.n_layers - (len(layers) if part == "block" else 0)


# ---------------------------------------------------------------- helpers from specs and rankings


def test_prune_arguments_from_specs_and_a_ranking(tmp_path):
    folder = hf_folder(tmp_path / "source", "llama")
    spec = StaticAblation(heads=((2, 1), (0, 3)), score="AHON (LN)", fraction=0.1)
    removal = first_layers([3, 1, 0, 2], 2, label="Block Influence")
    assert removal == LayerRemoval(layers=(3, 1), part="block", order="Block Influence")
    args = prune_arguments(spec, removal)
    assert args == dict(heads=((2, 1), (0, 3)), ablation="zero", layers=(3, 1), part="block")
    pruned = prune(str(folder), **args)
    assert pruned.kept_layers == (0, 2) and pruned.heads == ((0, 3), (2, 1))
    with pytest.raises(InputError, match="resolve it with a calibration"):
        prune_arguments(StaticAblation(score="AHON (LN)", fraction=0.1))
    with pytest.raises(InputError, match="no fixed head set"):
        prune_arguments(RandomAblation(fraction=0.1))
    with pytest.raises(InputError, match="at least one spec"):
        prune_arguments()
    with pytest.raises(InputError, match="from 1 to 3"):
        first_layers([3, 1, 0, 2], 4)
    with pytest.raises(InputError, match="more than once"):
        first_layers([3, 1, 1, 2], 1)


# ---------------------------------------------------------------- bad input


def test_bad_input_is_refused_saying_what_to_do(tmp_path):
    folder = hf_folder(tmp_path / "source", "qwen2")
    model = load_model(str(folder), device="cpu")
    with pytest.raises(InputError, match=r"head \(1, 4\) is outside the model's 4 layers x 4 heads"):
        prune(model, heads=[(1, 4)])
    with pytest.raises(InputError, match=r"layer\(s\) \[4\] out of range"):
        prune(model, layers=[4])
    with pytest.raises(InputError, match="removing all 4 layers"):
        prune(model, layers=[0, 1, 2, 3], part="block")
    with pytest.raises(InputError, match="needs heads=.*or layers="):
        prune(model)
    with pytest.raises(InputError, match="needs means="):
        prune(model, heads=[(0, 0)], ablation="mean")
    with pytest.raises(InputError, match="means has shape"):
        prune(model, heads=[(0, 0)], ablation="mean", means=torch.zeros(4, 4, 8))
    with pytest.raises(InputError, match="part must be one of"):
        prune(model, layers=[1], part="mlp")
    pruned = prune(model, layers=[1])
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="exists and is not empty.*overwrite=True"):
        pruned.save(tmp_path / "taken")
    pruned.save(tmp_path / "taken", overwrite=True)
    assert not (tmp_path / "taken" / "notes.txt").exists() and (tmp_path / "taken" / "config.json").exists()
    (tmp_path / "empty").mkdir()
    pruned.save(tmp_path / "empty")  # an empty folder is fine

    processed = load_model(str(folder), device="cpu", processing=True)
    with pytest.raises(InputError, match=r"processed .* weight basis.*load_model\(name, processing=False\)"):
        prune(processed, heads=[(0, 0)])
    from lens_heads import tiny_model

    with pytest.raises(InputError, match="not loaded from a Hugging Face folder"):
        prune(tiny_model("llama"), heads=[(0, 0)])
    with torch.no_grad():
        model.blocks[2].attn.W_O[1] += 1.0
    with pytest.raises(InputError, match="W_O of layer 2 differs from its folder"):
        prune(model, heads=[(0, 0)])


def test_a_config_list_prune_cannot_cut_is_refused(tmp_path):
    folder = hf_folder(tmp_path / "source", "llama", no_rope_layers=[1, 1, 0, 1])
    with pytest.raises(InputError, match="no_rope_layers look per-layer"):
        prune(str(folder), layers=[2], part="block")
    assert prune(str(folder), layers=[2], part="attention").kept_layers == (0, 1, 2, 3)  # nothing to cut


def test_a_family_prune_does_not_know_is_refused(tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "opt", vocab_size=101, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, word_embed_proj_dim=32)).save_pretrained(tmp_path / "opt")
    with pytest.raises(InputError, match="not of a 'opt' model"):
        prune(str(tmp_path / "opt"), layers=[0])
