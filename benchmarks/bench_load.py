"""Load time and forward throughput of the embedded model: HookedTransformer vs plain Hugging Face, same batch.

    python benchmarks/bench_load.py [--batch 4 --seq 128 --repeats 3] [--write-docs]

Cold load dequantises the GGUF into a fresh cache folder; warm load reads the cached safetensors.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import torch

from lens_heads.plumbing.settings import option
from timing import load_average, parse_settings, print_machine, repeated, timed, write_docs_option, write_printed


@dataclass(frozen=True)
class LoadBench:
    """What the benchmark times: the load, then forwards of one random batch in HookedTransformer and in
    Hugging Face."""

    batch: int = option(4, "inputs per forward")
    seq: int = option(128, "tokens per input")
    repeats: int = option(3, "forwards timed (median reported)")
    skip_cold: bool = option(False, "skip the ~30-60 s dequantisation")
    write_docs: bool = write_docs_option("Loading and forward throughput")



def cold_load() -> float:
    """Seconds to load the embedded model into an empty cache folder (dequantisation, cache write, build)."""
    from lens_heads import load_model

    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("LENS_HEADS_CACHE")
        os.environ["LENS_HEADS_CACHE"] = cache
        seconds = timed(load_model).wall
        if old is None:
            del os.environ["LENS_HEADS_CACHE"]
        else:
            os.environ["LENS_HEADS_CACHE"] = old
    return seconds


def forward_throughput(model, s: LoadBench) -> str:
    """HookedTransformer against plain Hugging Face on the same random batch."""
    from transformers import AutoModelForCausalLM

    from lens_heads.models.embedded import embedded_model_folder

    hf = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32).eval()
    tokens = torch.randint(0, model.cfg.d_vocab, (s.batch, s.seq), generator=torch.Generator().manual_seed(0))
    n_tokens = tokens.numel()
    with torch.no_grad():
        model(tokens), hf(tokens)  # warm-up
        t_tl = repeated(lambda: model(tokens), s.repeats).wall
        t_hf = repeated(lambda: hf(tokens), s.repeats).wall
    return (f"forward {s.batch}x{s.seq}: HookedTransformer {n_tokens / t_tl:8.0f} tok/s, "
            f"plain HF {n_tokens / t_hf:8.0f} tok/s, ratio TL/HF throughput {t_hf / t_tl:.2f}x")


def main(argv=None) -> None:
    s = parse_settings(LoadBench, argv, __doc__)
    started_load = load_average()
    from lens_heads import load_model

    lines = []
    if not s.skip_cold:
        lines.append(f"cold load (GGUF dequantisation + cache write + build): {cold_load():6.1f} s")
    load_model()  # make sure the default cache exists
    warm = timed(load_model)
    lines.append(f"warm load (cached safetensors -> HookedTransformer):     {warm.wall:6.1f} s")
    lines.append(forward_throughput(warm.out, s))
    print("\n".join(lines))
    machine = print_machine(started_load)
    if s.write_docs:
        write_printed("Loading and forward throughput", f"python benchmarks/bench_load.py --batch {s.batch} --seq "
                      f"{s.seq} --repeats {s.repeats}", machine, f"; forward times are medians of {s.repeats}.",
                      [lines], after=["The warm path loads the state dict in one `load_state_dict` call; "
                                      "TransformerLens's `load_and_process_state_dict` loads key by key (~5 s more) "
                                      "and is used only with `processing=True`."])


if __name__ == "__main__":
    main()
