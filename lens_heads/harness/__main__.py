"""``python -m lens_heads.harness ARGS``: lm-eval's command line (``lm_eval ARGS``) with the ``lens_heads`` model
registered, for lm-eval releases that don't discover it through the ``lm_eval.models`` entry point; e.g.
``python -m lens_heads.harness --model lens_heads --model_args ablation=threshold:AHON (LN):0.1 --tasks arc_easy``.

lm-eval writes its results and samples with plain writes, so a run stopped while writing would leave a partial file.
Here its ``--output_path`` is a hidden staging folder beside the one asked for, whose files move into place (each
an atomic rename) only once the run has finished; a run stopped by SIGTERM/SIGINT (exit 143/130) or failing removes
the staging folder, so the output folder holds whole files or none. (A kill -9 can leave the hidden staging folder,
never a partial file where the results go.)
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

from lm_eval.__main__ import cli_evaluate

import lens_heads.harness.lm  # noqa: F401  (registers the lens_heads model with lm-eval)
from lens_heads.plumbing.signals import EXIT_CODES, Stopped

FLAGS = ("--output_path", "-o")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    asked, args = _staged(args)
    staging = Path(args[args.index(FLAGS[0]) + 1]) if asked is not None else None
    previous = {s: signal.signal(s, _stop) for s in EXIT_CODES}
    saved = sys.argv
    try:
        sys.argv = [saved[0], *args]
        cli_evaluate()
        if asked is not None and staging is not None:
            _move_into_place(staging, asked)
    except Stopped as e:
        print(f"lens_heads: lm-eval run stopped by {e.signal} (exit {e.code}): no output file was written"
              + (f" to {asked}" if asked is not None else "") + "; run the same command again", file=sys.stderr)
        raise
    finally:
        sys.argv = saved
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if staging is not None:
            shutil.rmtree(_staging_root(staging, asked), ignore_errors=True)


def _stop(signum, frame) -> None:
    raise Stopped(signum)


def _staged(args: list[str]) -> tuple[Path | None, list[str]]:
    """The output path asked for (None: none) and the arguments with it replaced by a staging path in a hidden
    folder beside it (same file system: the final moves are renames)."""
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in FLAGS:
            if value:
                rest = args[i + 1:]
            elif i + 1 < len(args):
                value, rest = args[i + 1], args[i + 2:]
            else:
                return None, args
            asked = Path(value)
            root = asked.parent / f".{asked.name}.partial-{os.getpid()}"
            staging = root / asked.name if asked.suffix == ".json" else root
            return asked, [*args[:i], FLAGS[0], str(staging), *rest]
    return None, args


def _staging_root(staging: Path, asked: Path | None) -> Path:
    return staging.parent if asked is not None and asked.suffix == ".json" else staging


def _move_into_place(staging: Path, asked: Path) -> None:
    """Every file lm-eval wrote under the staging path, renamed to the same place under the path asked for."""
    root, target = (staging.parent, asked.parent) if asked.suffix == ".json" else (staging, asked)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        final = target / path.relative_to(root)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, final)


if __name__ == "__main__":
    main()
