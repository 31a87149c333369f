"""Command line: ``python -m lens_heads.report [MODEL] [options]`` writes a self-contained report folder.

Bad arguments and unreachable models end with one line saying what went wrong and what to do (no traceback);
exit codes: 0 done, 1 a stage failed or the model/data can't be reached, 2 bad arguments, 130 interrupted.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import fields

from lens_heads.report.config import ALL_SCORES, DEFAULT_PROMPT, QUICK, TASK_NAMES, ReportConfig, quick

PROG = "python -m lens_heads.report"
DEFAULTS = {f.name: f.default for f in fields(ReportConfig) if not callable(f.default_factory)}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument gives one line: the reason and where to look."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}. Run `{PROG} --help` for the options.\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value}")
    return value


def _tasks(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in TASK_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown task {', '.join(map(repr, bad)) or repr(text)}: choose from "
                                         f"{', '.join(TASK_NAMES)} (comma-separated)")
    return tuple(dict.fromkeys(names))


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0,0.1,0.2, got {text!r}") from None
    if not values or any(not 0 <= v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"fractions must lie in [0, 1), got {text!r}")
    return tuple(sorted({0.0, *values}))  # 0 is the unablated baseline every curve starts from


def _score_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _names(scores) -> str:
    return "all twelve" if tuple(scores) == ALL_SCORES else ", ".join(scores)


def _scores(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "all":
        return ALL_SCORES
    by_key = {_score_key(s): s for s in ALL_SCORES}
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in wanted if _score_key(s) not in by_key]
    if bad or not wanted:
        raise argparse.ArgumentTypeError(f"unknown score {', '.join(map(repr, bad)) or repr(text)}: choose from "
                                         f"{', '.join(ALL_SCORES)} or 'all' (comma-separated)")
    return tuple(dict.fromkeys(by_key[_score_key(s)] for s in wanted))


def _prompt(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a prompt must contain some text")
    return text


def _sweep_path(text: str) -> str:
    from pathlib import Path

    path = Path(text)
    if not (path / "sweep.json").is_file() and not (path.is_file() and path.suffix == ".json"):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a sweep folder (run_sweep's out_dir, with a "
                                         "sweep.json) nor a sweep_<task>.json written by analyses/sweep.py")
    return text


def parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    p = OneLineParser(
        prog=PROG,
        description="Find the inactive attention heads and lazy layers of a model and write one self-contained "
                    "report folder: report.html (interactive, works offline), results.json (every number, with "
                    "model, data, sample sizes, seed, weight basis and versions), CSV tables and PNG figures. "
                    "Finished stages are cached in the folder, so a rerun (or a resumed interrupted run) reuses them.",
        epilog=f"Examples: `{PROG}` (embedded SmolLM2-135M, about 10 min on 2 CPU cores); `{PROG} --quick` (about "
               f"3 min); `{PROG} gpt2-medium --device cuda --n 500` (needs the Hugging Face hub or its cache).")
    p.add_argument("model", nargs="?", default=d["model"],
                   help=f"model to report on: the embedded default {d['model']!r} (no network needed), a "
                        "TransformerLens model name such as gpt2-medium (needs the hub or its cache), or a local "
                        "Hugging Face model folder (default: %(default)s)")
    p.add_argument("--tasks", type=_tasks, default=None, metavar="T1,T2",
                   help=f"comma-separated benchmarks to score and ablate on, from {', '.join(TASK_NAMES)}; pick "
                        "tasks where the model is above chance (default: arc_easy)")
    p.add_argument("--n", type=_positive_int, default=None, metavar="N",
                   help=f"items sampled per task (by --seed) for scoring and for every evaluation of the sweep "
                        f"(default: {d['n']}; --quick: {QUICK['n']})")
    p.add_argument("--rank-n", type=_positive_int, default=None, metavar="N",
                   help=f"prompts of the first task used for the attention-rank profile (default: {d['rank_n']}; "
                        f"--quick: {QUICK['rank_n']})")
    p.add_argument("--fractions", type=_fractions, default=None, metavar="F1,F2",
                   help="comma-separated target shares of heads to zero in the sweep, in [0, 1); 0 (the baseline) "
                        f"is always added (default: {','.join(f'{f:g}' for f in d['fractions'])}; --quick: "
                        f"{','.join(f'{f:g}' for f in QUICK['fractions'])}; the paper: 0,.05,.1,.15,.2,.25,.3)")
    p.add_argument("--scores", type=_scores, default=None, metavar="S1,S2",
                   help=f"comma-separated scores that choose the heads to zero in the sweep, or 'all' (all twelve "
                        f"are always computed and shown); names as in the paper, case and spaces ignored, e.g. "
                        f"'AHON (LN)' or ahon_ln (default: {_names(d['scores'])}; --quick: "
                        f"{', '.join(QUICK['scores'])})")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder; reruns into the same folder reuse its cached stages "
                        "(default: report/<model>)")
    p.add_argument("--prompt", type=_prompt, action="append", default=None, metavar="TEXT",
                   help=f"example prompt for the attention plots; repeat for several (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--heads-shown", type=_positive_int, default=None, metavar="K",
                   help=f"how many most- and least-active heads the attention plots show (default: {d['heads_shown']})")
    p.add_argument("--compare", type=_sweep_path, nargs="+", default=None, metavar="PATH",
                   help="recorded sweeps to compare with this report's own (run_sweep output folders or "
                        "sweep_<task>.json files of analyses/sweep.py, each a different model or task): a section "
                        "ranks the scores per (model, task) and compares the rankings; it also appears, without "
                        "--compare, when --tasks names more than one task")
    p.add_argument("--device", default=None,
                   help="torch device, e.g. cpu, cuda, cuda:1, mps (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help=f"weights and activations dtype (default: {d['dtype']})")
    p.add_argument("--batch-size", type=_positive_int, default=None, metavar="B",
                   help=f"inputs per forward pass (default: {d['batch_size']})")
    p.add_argument("--seed", type=int, default=None,
                   help=f"seed of the data samples and the random-zeroing baseline (default: {d['seed']})")
    p.add_argument("--quick", action="store_true",
                   help="small samples, two scores and three fractions: a report in about 3 minutes on 2 CPU cores "
                        "(values given explicitly still win)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG figures (they need Chromium for kaleido)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def config_from_args(argv: list[str] | None = None) -> ReportConfig:
    args = parser().parse_args(argv)
    given = {"model": args.model, "tasks": args.tasks, "n": args.n, "rank_n": args.rank_n,
             "fractions": args.fractions, "scores": args.scores, "out": args.out,
             "prompts": tuple(args.prompt) if args.prompt else None, "heads_shown": args.heads_shown,
             "compare": tuple(args.compare) if args.compare else None,
             "device": args.device, "dtype": args.dtype, "batch_size": args.batch_size, "seed": args.seed}
    explicit = {k for k, v in given.items() if v is not None}
    config = ReportConfig(**{k: v for k, v in given.items() if v is not None}, png=not args.no_png,
                          progress=not args.no_progress)
    if args.device:
        _check_device(args.device)
    return quick(config, explicit) if args.quick else config


def _check_device(device: str) -> None:
    from lens_heads.models import resolve_device

    try:
        resolve_device(device)
    except ValueError as e:
        _fail(2, str(e))


def _fail(code: int, message: str):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    config = config_from_args(argv)
    from lens_heads.models import ModelUnavailableError
    from lens_heads.report.pipeline import build_report
    from lens_heads.tasks import TaskDataUnavailableError

    try:
        results = build_report(config)
    except (ModelUnavailableError, TaskDataUnavailableError) as e:
        _fail(1, str(e).replace("\n", " "))
    except KeyboardInterrupt:
        _fail(130, f"interrupted; rerun the same command to resume (finished stages are cached in {config.out_dir})")
    failed = [k for k, v in results["stages"].items() if v["status"] == "failed"]
    if failed:
        print(f"{PROG}: error: stage(s) {', '.join(failed)} failed (see the report and results.json in "
              f"{config.out_dir}); the other stages' results were written", file=sys.stderr)
        return 1
    from lens_heads import distributed

    if distributed.is_main():  # under torchrun: rank 0 wrote the report
        print(f"{config.out_dir}/report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
