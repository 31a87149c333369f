"""Command line: ``python -m lens_heads.report [MODEL] [options]`` writes a self-contained report folder.

The flags are the fields of :class:`ReportConfig` (``lens_heads.plumbing.settings``); ``--quick`` is its "quick" preset.
Bad arguments and unreachable models end with one line saying what went wrong and what to do (no traceback);
exit codes: 0 done, 1 a stage failed or the model/data can't be reached, 2 bad arguments, 130 interrupted (SIGINT,
Ctrl-C), 143 terminated (SIGTERM: a scheduler's preemption); after 130 or 143 the same command resumes from the
finished stages (:mod:`lens_heads.plumbing.signals`).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys

from lens_heads.data.benchmark_files import TaskDataUnavailableError
from lens_heads.data.custom_tasks import TaskFileError
from lens_heads.models.embedded import ModelUnavailableError
from lens_heads.plumbing import distributed
from lens_heads.plumbing.settings import from_args
from lens_heads.plumbing.signals import stoppable
from lens_heads.report.config import DEFAULT_PROMPT, PRESETS, ReportConfig, prompt, sweep_path
from lens_heads.report.pipeline import build_report

PROG = "python -m lens_heads.report"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument gives one line: the reason and where to look."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}. Run `{PROG} --help` for the options.\n")


def parser() -> OneLineParser:
    """The flags that take several values; ``from_args`` adds one flag per field of :class:`ReportConfig`."""
    p = OneLineParser(
        prog=PROG,
        description="Find the inactive attention heads and lazy layers of a model and write one self-contained "
                    "report folder: report.html (interactive, works offline), results.json (every number, with "
                    "model, data, sample sizes, seed, weight basis and versions), CSV tables and PNG figures. "
                    "Finished stages are cached in the folder, so a rerun (or a resumed interrupted run) reuses them.",
        epilog=f"Examples: `{PROG}` (the embedded SmolLM2-135M; its recorded time and memory are in the README); "
               f"`{PROG} --quick` (a smaller run); `{PROG} gpt2-medium --device cuda --n 500` (needs the Hugging "
               "Face hub or its cache).",
        argument_default=argparse.SUPPRESS)
    p.add_argument("--prompt", dest="prompts", type=prompt, action="append", metavar="TEXT",
                   help=f"example prompt for the attention plots; repeat for several (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--compare", type=sweep_path, nargs="+", metavar="PATH",
                   help="recorded sweeps to compare with this report's own (run_sweep output folders or "
                        "sweep_<task>.json files of analyses/sweep.py, each a different model or task): a section "
                        "ranks the scores per (model, task) and compares the rankings; it also appears, without "
                        "--compare, when --tasks names more than one task")
    return p


def config_from_args(argv: list[str] | None = None) -> ReportConfig:
    """The settings of the command line; ``--task-file`` without ``--tasks`` runs on the file's items alone."""
    config = from_args(ReportConfig, argv, presets=PRESETS, parser=parser())
    given = sys.argv[1:] if argv is None else argv
    if config.task_file and not any(a == "--tasks" or a.startswith("--tasks=") for a in given):
        config = dataclasses.replace(config, tasks=())
    return config


def _fail(code: int, message: str):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    config = config_from_args(argv)

    try:
        with stoppable("report", f"in {config.out_dir} (finished stages are cached there)"):
            results = build_report(config, command=shlex.join([*PROG.split(), *(sys.argv[1:] if argv is None else argv)]))
    except TaskFileError as e:
        _fail(2, str(e).replace("\n", " "))
    except (ModelUnavailableError, TaskDataUnavailableError) as e:
        _fail(1, str(e).replace("\n", " "))
    except KeyboardInterrupt:
        _fail(130, f"interrupted; rerun the same command to resume (finished stages are cached in {config.out_dir})")
    failed = [k for k, v in results["stages"].items() if v["status"] == "failed"]
    if failed:
        print(f"{PROG}: error: stage(s) {', '.join(failed)} failed (see the report and results.json in "
              f"{config.out_dir}); the other stages' results were written", file=sys.stderr)
        return 1
    if distributed.is_main():  # under torchrun: rank 0 wrote the report
        print(f"{config.out_dir}/report.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
