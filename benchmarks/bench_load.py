"""Load time and forward throughput of the embedded model: HookedTransformer vs plain Hugging Face, same batch.

    python benchmarks/bench_load.py [--batch 4 --seq 128 --repeats 3]

Cold load dequantises the GGUF into a fresh cache folder; warm load reads the cached safetensors.
"""

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch


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
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from lens_heads import load_model
    from lens_heads.models import embedded_model_folder

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
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
        print(f"cold load (GGUF dequantisation + cache write + build): {cold:6.1f} s")
    load_model()  # make sure the default cache exists
    t = time.perf_counter()
    model = load_model()
    warm = time.perf_counter() - t
    print(f"warm load (cached safetensors -> HookedTransformer):     {warm:6.1f} s")

    hf = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32).eval()
    tokens = torch.randint(0, model.cfg.d_vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    n_tokens = tokens.numel()
    with torch.no_grad():
        model(tokens), hf(tokens)  # warm-up
        t_tl = timed(lambda: model(tokens), args.repeats)
        t_hf = timed(lambda: hf(tokens), args.repeats)
    print(f"forward {args.batch}x{args.seq}: HookedTransformer {n_tokens / t_tl:8.0f} tok/s, "
          f"plain HF {n_tokens / t_hf:8.0f} tok/s, ratio TL/HF throughput {t_hf / t_tl:.2f}x")


if __name__ == "__main__":
    main()
