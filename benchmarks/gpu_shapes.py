"""The models the GPU check runs: real architectures (SmolLM2-135M, Qwen2.5-0.5B, a Llama-3.2-1B shape, a
Qwen2.5-7B shape: the largest that fits one GPU in bf16 twice, as the Hugging Face model and the HookedTransformer) at
random init, each a Hugging Face model (SDPA attention) and a HookedTransformer holding the same weights, reading rows of
space-separated token ids."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from lens_heads.models.loading import hooked_from_hf

# the longest prompt the scoring pass is measured on (above the longest MMLU 5-shot row)
N_CTX = 8192


@dataclass(frozen=True)
class Shape:
    """A model's architecture numbers (from its released config.json); ``family`` picks the Hugging Face class."""

    family: str  # "llama" | "qwen2"
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    vocab: int
    tied: bool = True

    def n_params(self) -> int:
        """Its parameters, norms and biases left out (well under 1%): the size the check's projection matches."""
        attention = 2 * self.d_model * self.n_heads * self.d_head + 2 * self.d_model * self.n_kv_heads * self.d_head
        return self.vocab * self.d_model * (1 if self.tied else 2) + self.n_layers * (
            attention + 3 * self.d_model * self.d_mlp)

    def smoke(self) -> Shape:
        """The same family at toy size: runs on a CPU in a second."""
        return Shape(self.family, 2, 64, 4, 2, 16, 128, 512, self.tied)


SHAPES = {
    "smollm2-135m": Shape("llama", 30, 576, 9, 3, 64, 1536, 49152),
    "qwen2.5-0.5b": Shape("qwen2", 24, 896, 14, 2, 64, 4864, 151936),
    "llama-3.2-1b": Shape("llama", 16, 2048, 32, 8, 64, 8192, 128256),
    "qwen2.5-7b": Shape("qwen2", 28, 3584, 28, 4, 128, 18944, 152064, tied=False),  # 7.6B: 15 GB per copy in bf16
}


def parse_shapes(text: str) -> tuple[str, ...]:
    """Comma-separated shape names, each one of :data:`SHAPES`."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise ValueError(f"unknown shape {', '.join(unknown) or '(none given)'}: choose from {', '.join(SHAPES)} "
                         "(--smoke shrinks them to toy size)")
    return names


def hf_config(shape: Shape):
    """The Hugging Face config of ``shape`` (rope base left at the default: it changes values, not cost)."""
    from transformers import LlamaConfig, Qwen2Config

    kind = {"llama": LlamaConfig, "qwen2": Qwen2Config}[shape.family]
    return kind(num_hidden_layers=shape.n_layers, hidden_size=shape.d_model, num_attention_heads=shape.n_heads,
                num_key_value_heads=shape.n_kv_heads, head_dim=shape.d_head, intermediate_size=shape.d_mlp,
                vocab_size=shape.vocab, tie_word_embeddings=shape.tied, max_position_embeddings=N_CTX,
                architectures=[{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[shape.family]])


@dataclass  # not frozen: TransformerLens sets padding_side for the length of a forward
class IdTokenizer:
    """Text of space-separated token ids read back as those ids: synthetic rows go through the evaluator's own task
    and row code (MMLU's letter format: one row per question, four one-token continuations)."""

    vocab: int
    pad_token_id: int = 0
    eos_token_id: int = 0
    bos_token_id: int | None = None
    padding_side: str = "right"
    chat_template: str | None = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [int(t) for t in text.split()]}

    def __len__(self) -> int:
        return self.vocab


def build_pair(name: str, shape: Shape, device: str, dtype: torch.dtype, seed: int):
    """The random-init Hugging Face model (SDPA) of ``shape`` and a HookedTransformer with the same weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(shape)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").eval()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folder = Path(tmp) / name
        config.save_pretrained(folder)
        model = hooked_from_hf(hf, folder, None, processing=False, device=device, dtype=dtype)
    model.tokenizer = IdTokenizer(shape.vocab)
    model.eval()
    model.lens_heads_meta = {"name": name, "source": f"random init, seed {seed}, same weights as the HF model",
                             "weight_basis": "raw (no weight processing)", "dtype": str(dtype).replace("torch.", "")}
    return hf, model
