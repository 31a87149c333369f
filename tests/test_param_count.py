"""The model card's parameter count is the source model's: Hugging Face's own count of the same folder (its
``parameters()`` holds a tied matrix once and no zero biases), whether or not TransformerLens's copy of a tied
unembedding equals the embedding (gemma's does not: its embedding is scaled)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import lens_heads as lh
from families import build_folder
from lens_heads.models.loading import tied_embeddings


def source_count(folder) -> int:
    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())


@pytest.mark.parametrize("family, tied", [("llama-3", True), ("llama-3", False), ("gemma-3", True),
                                          ("gemma-3", False)])
def test_tiny_folders_count_as_their_source(tmp_path, family, tied):
    folder = build_folder(family, tmp_path, config=dict(tie_word_embeddings=tied))
    model = lh.load_model(str(folder), device="cpu")
    d_vocab, d_model = model.cfg.d_vocab, model.cfg.d_model
    n = lh.model_meta(model)["n_params"]
    assert n == source_count(folder)
    # the difference is the unembedding, where tied: the case under test, not a count that agrees by accident
    untied = build_folder(family, tmp_path / "other", config=dict(tie_word_embeddings=not tied))
    assert source_count(untied) - n == (d_vocab * d_model if tied else -d_vocab * d_model)


def test_a_gemma_3_270m_shaped_model_counts_268m_not_436m():
    """The released shape (random weights, TransformerLens's own init): Hugging Face's count of the same config,
    built on the meta device (no memory), is the source's; the tie comes from that config, as load_model reads it."""
    import sys
    import warnings
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from transformer_lens import HookedTransformer
    from transformers import Gemma3TextConfig

    from gemma_shape import GEMMA_3_270M, gemma3_270m_config

    hf_config = Gemma3TextConfig(**GEMMA_3_270M, architectures=["Gemma3ForCausalLM"])
    with torch.device("meta"):
        expected = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf_config).parameters())
    cfg = gemma3_270m_config()
    cfg.init_weights, cfg.tokenizer_name = False, None  # the count does not read the weights' values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HookedTransformer(cfg, move_to_device=False)
    model.lens_heads_meta = {"name": "gemma-3-270m shape", "tied_embeddings": tied_embeddings(hf_config)}
    assert hf_config.tie_word_embeddings
    assert lh.model_meta(model)["n_params"] == expected
    assert 267e6 < expected < 269e6  # the released model's ~268M


@pytest.mark.slow
def test_the_embedded_smollm2_counts_as_its_source(smollm):
    from lens_heads.models.embedded import embedded_model_folder

    folder = embedded_model_folder("smollm2-135m")
    assert smollm.lens_heads_meta["tied_embeddings"] is True  # SmolLM2's config ties them
    assert lh.model_meta(smollm)["n_params"] == source_count(folder)
