"""What a report run is asked to do: one settings dataclass (its fields are the command-line flags) and the
``quick`` preset.

The sizes are chosen so that the default report of the embedded SmolLM2-135M finishes within ten minutes on an idle
2-core CPU and ``--quick`` within a few (``docs/records/report_live.json`` times both, and ``gpt2-medium``'s). Cost is
set by the sweep: ``1 + (fractions - 1) x (scores + 1)`` evaluations of ``n`` ARC-Easy items. The run says when it
starts how long it expects to take (:mod:`lens_heads.report.estimate`), and each run records its wall and CPU seconds
per stage in results.json.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path

from lens_heads.data.custom_tasks import CUSTOM_FORMATS
from lens_heads.data.tasks import INACTIVE_HEADS_TASKS, TASK_SOURCES
from lens_heads.evaluation.eval_settings import EvalSettings
from lens_heads.heads.scores import SCORE_NAMES, score_names
from lens_heads.models.backends import BACKENDS
from lens_heads.models.embedded import DEFAULT_MODEL
from lens_heads.models.loading import resolve_device
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import safe_name
from lens_heads.plumbing.settings import checked_fields, option

ALL_SCORES = tuple(SCORE_NAMES)
# The score the paper found most robust; it picks the "most/least active" heads shown in the attention plots.
ACTIVITY_SCORE = "AHON (LN)"
DEFAULT_PROMPT = "When Mary and John went to the store, John gave a drink to"
TASK_NAMES = INACTIVE_HEADS_TASKS  # the inactive-heads paper's multiple-choice benchmarks


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value}")
    return value


def task_names(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in TASK_NAMES and not t.startswith(tuple(TASK_SOURCES))]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown task {', '.join(map(repr, bad)) or repr(text)}: choose from "
                                         f"{', '.join(TASK_NAMES)} or lm_eval:TASK (comma-separated)")
    return tuple(dict.fromkeys(names))


def fractions(text: str) -> tuple[float, ...]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0,0.1,0.2, got {text!r}") from None
    if not values or any(not 0 <= v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"fractions must lie in [0, 1), got {text!r}")
    return tuple(sorted({0.0, *values}))  # 0 is the unablated baseline every curve starts from


def scores_to_sweep(text: str) -> tuple[str, ...]:
    """At least one score name (:func:`lens_heads.heads.scores.score_names`)."""
    names = score_names(text)
    if not names:
        raise InputError(f"name at least one score, or 'all': got {text!r}")
    return names


def prompt(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a prompt must contain some text")
    return text


def sweep_path(text: str) -> str:
    path = Path(text)
    if not (path / "sweep.json").is_file() and not (path.is_file() and path.suffix == ".json"):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a sweep folder (run_sweep's out_dir, with a "
                                         "sweep.json) nor a sweep_<task>.json written by analyses/sweep.py")
    return text


def task_file(text: str) -> str:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"task file {text!r} does not exist")
    if path.suffix not in (".jsonl", ".json"):
        raise argparse.ArgumentTypeError(f"task file {text!r}: expected .jsonl (one record a line) or .json (a list)")
    return text


def device(text: str) -> str:
    resolve_device(text)  # its ValueError says which devices exist
    return text


@dataclass(frozen=True)
class ReportConfig:
    """Settings of one report; every field is written to ``results.json``."""

    model: str = option(DEFAULT_MODEL, "model to report on: the embedded default (no network needed), a "
                        "TransformerLens model name such as gpt2-medium (needs the hub or its cache), or a local "
                        "Hugging Face model folder", positional=True)
    tasks: tuple[str, ...] = option(("arc_easy",), f"comma-separated benchmarks to score and ablate on, from "
                                    f"{', '.join(TASK_NAMES)}; pick tasks where the model is above chance",
                                    parse=task_names, metavar="T1,T2")
    task_file: str | None = option(None, "your own multiple-choice items: a .jsonl file of lm-eval-like records "
                                   "(context, choices, gold; optional id, fewshot), named after the file in the "
                                   "report; without --tasks the report runs on it alone", parse=task_file,
                                   metavar="FILE")
    task_format: str = option("cloze", "prompt format of --task-file: cloze (each choice scored after the "
                              "context) or letter (choices listed as A., B., ...; continuations ' A', ' B', ...)",
                              choices=CUSTOM_FORMATS)
    n: int = option(40, "items sampled per task (by --seed) for scoring and for every evaluation of the sweep",
                    parse=positive_int, metavar="N")
    rank_n: int = option(32, "prompts of the first task used for the attention-rank profile", parse=positive_int,
                         metavar="N")
    fractions: tuple[float, ...] = option((0.0, 0.1, 0.2, 0.3), "comma-separated target shares of heads to zero "
                                          "in the sweep, in [0, 1); 0 (the baseline) is always added (the paper: "
                                          "0,.05,.1,.15,.2,.25,.3)", parse=fractions, metavar="F1,F2")
    # All twelve choose heads in the sweep: ranking them is the paper's question (--scores picks fewer).
    scores: tuple[str, ...] = option(ALL_SCORES, "comma-separated scores that choose the heads to zero in the "
                                     "sweep, or 'all' (all twelve are always computed and shown); names as in the "
                                     "paper, case and spaces ignored, e.g. 'AHON (LN)' or ahon_ln",
                                     parse=scores_to_sweep, metavar="S1,S2")
    out: str | None = option(None, "output folder (None: report/<model>); reruns into the same folder reuse its "
                             "cached stages", metavar="DIR")
    # --prompt (repeatable) and --compare (several paths) are added by the command line itself
    prompts: tuple[str, ...] = option((DEFAULT_PROMPT,), cli=False)
    heads_shown: int = option(4, "how many most- and least-active heads the attention plots show",
                              parse=positive_int, metavar="K")
    compare: tuple[str, ...] = option((), cli=False)
    device: str | None = option(None, "torch device, e.g. cpu, cuda, cuda:1, mps (None: cuda if available, else "
                                "cpu)", parse=device)
    dtype: str = option("float32", "weights and activations dtype", choices=("float32", "bfloat16", "float16"))
    backend: str | None = option(None, "TransformerLens backend: hooked (HookedTransformer, TransformerLens 3.9) or "
                                 "bridge (TransformerBridge, 4.x); None: the one installed", choices=BACKENDS)
    batch_size: int = option(8, "inputs per forward pass", parse=positive_int, metavar="B")
    seed: int = option(0, "seed of the data samples and the random-zeroing baseline")
    quick: bool = option(False, cli=False)  # set by the "quick" preset, so results.json says it was used
    png: bool = option(True, "write the PNG figures (they need Chromium for kaleido)")
    progress: bool = option(True, "show progress bars")

    def __post_init__(self):
        # built in Python, the settings meet the same checks as their flags
        for name, value in checked_fields(self).items():
            object.__setattr__(self, name, value)
        if not self.tasks and not self.task_file:
            raise InputError("name a benchmark with --tasks or your own items with --task-file")
        if not all(isinstance(p, str) and p.strip() for p in self.prompts):
            raise InputError(f"ReportConfig(prompts=...): each prompt must be a non-empty string, got {self.prompts!r}")
        for path in self.compare:
            try:
                sweep_path(str(path))
            except argparse.ArgumentTypeError as e:
                raise InputError(f"ReportConfig(compare=...): {e}") from None

    @property
    def evaluation(self) -> EvalSettings:
        """The evaluation settings every stage evaluates and scores under (each result's meta records them)."""
        return EvalSettings(batch_size=self.batch_size)

    @property
    def out_dir(self) -> str:
        return self.out or f"report/{safe_name(self.model)}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["out"] = self.out_dir
        return d


# ``--quick``: small samples, two scores, three fractions; flags given explicitly still win.
QUICK = dict(quick=True, n=16, rank_n=8, fractions=(0.0, 0.15, 0.3), scores=("AWFT", "AHON (LN)"))
PRESETS = {"quick": QUICK}
