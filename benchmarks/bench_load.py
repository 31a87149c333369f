"""Load time and forward throughput of the embedded model: HookedTransformer vs plain Hugging Face, same batch.

    python benchmarks/bench_load.py [--batch 4 --seq 128 --repeats 3] [--write-docs]

Cold load dequantises the GGUF into a fresh cache folder; warm load reads the cached safetensors.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch

from docs_section import machine_line, write_section


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-cold", action="store_true", help="skip the ~30-60 s dequantisation")
    ap.add_argument("--write-docs", action="store_true", help="write the figures into docs/benchmarks.md")
    args = ap.parse_args()
    started_load = os.getloadavg()[0]

    from transformers import AutoModelForCausalLM

    from lens_heads import load_model
    from lens_heads.models import embedded_model_folder

    lines = []
    if not args.skip_cold:
        with tempfile.TemporaryDirectory() as cache:
            old = os.environ.get("LENS_HEADS_CACHE")
            os.environ["LENS_HEADS_CACHE"] = cache
            t = time.perf_counter()
            load_model()
            cold = time.perf_counter() - t
            if old is None:
                del os.environ["LENS_HEADS_CACHE"]
            else:
                os.environ["LENS_HEADS_CACHE"] = old
        lines.append(f"cold load (GGUF dequantisation + cache write + build): {cold:6.1f} s")
    load_model()  # make sure the default cache exists
    t = time.perf_counter()
    model = load_model()
    warm = time.perf_counter() - t
    lines.append(f"warm load (cached safetensors -> HookedTransformer):     {warm:6.1f} s")

    hf = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32).eval()
    tokens = torch.randint(0, model.cfg.d_vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    n_tokens = tokens.numel()
    with torch.no_grad():
        model(tokens), hf(tokens)  # warm-up
        t_tl = timed(lambda: model(tokens), args.repeats)
        t_hf = timed(lambda: hf(tokens), args.repeats)
    lines.append(f"forward {args.batch}x{args.seq}: HookedTransformer {n_tokens / t_tl:8.0f} tok/s, "
                 f"plain HF {n_tokens / t_hf:8.0f} tok/s, ratio TL/HF throughput {t_hf / t_tl:.2f}x")
    machine = machine_line(started_load)
    print("\n".join(lines + [f"machine: {machine}"]))
    if args.write_docs:
        write_section("Loading and forward throughput", "\n".join([
            f"`python benchmarks/bench_load.py --batch {args.batch} --seq {args.seq} --repeats {args.repeats}` "
            f"({machine}); forward times are medians of {args.repeats}.", "", "```", *lines, "```", "",
            "The warm path loads the state dict in one `load_state_dict` call; TransformerLens's "
            "`load_and_process_state_dict` loads key by key (~5 s more) and is used only with `processing=True`."]))


if __name__ == "__main__":
    main()
