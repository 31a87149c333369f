"""What a report run is asked to do: one dataclass of plain values, with the default and the ``--quick`` preset.

The sizes are chosen so that the default report of the embedded SmolLM2-135M finishes within 15 minutes on an idle
2-core CPU and ``--quick`` within 3. Cost is set by the sweep: (1 + (fractions - 1) x (scores + 1)) evaluations of
``n`` ARC-Easy items, about 0.36 s an item on 2 idle cores: default 40 units x 40 items = 1,600 item evaluations
(~10 min), quick 7 x 16 = 112 (~1 min). The head-effects stage (attribution patching on the same items, about
1.9 CPU seconds an ARC-Easy item: a forward and a backward pass) adds about a minute; --quick skips it. Each run
records its wall and CPU seconds per stage in results.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from lens_heads.io import slug
from lens_heads.models import DEFAULT_MODEL

ALL_SCORES = ("AWFT", "AEQD", "FTVVN", "AVVN", "LTHON", "AHON", "AWFT (LN)", "AEQD (LN)", "FTVVN (LN)", "AVVN (LN)",
              "LTHON (LN)", "AHON (LN)")
# The score the paper found most robust; it picks the "most/least active" heads shown in the attention plots.
ACTIVITY_SCORE = "AHON (LN)"
DEFAULT_PROMPT = "When Mary and John went to the store, John gave a drink to"
TASK_NAMES = ("mmlu", "arc_easy", "piqa", "winogrande", "hellaswag")


@dataclass(frozen=True)
class ReportConfig:
    """Settings of one report; every field is written to ``results.json``."""

    model: str = DEFAULT_MODEL
    out: str | None = None  # default: report/<model>
    tasks: tuple[str, ...] = ("arc_easy",)
    n: int = 40  # evaluated (and scored) items per task
    rank_n: int = 32  # inputs for the attention-rank profile
    fractions: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3)
    # All twelve choose heads in the sweep: ranking them is the paper's question (--scores picks fewer).
    scores: tuple[str, ...] = ALL_SCORES
    prompts: tuple[str, ...] = (DEFAULT_PROMPT,)
    heads_shown: int = 4  # most and least active heads each, in the attention plots
    compare: tuple[str, ...] = ()  # recorded sweeps (folders or sweep_<task>.json) compared with the report's own
    device: str | None = None
    dtype: str = "float32"
    batch_size: int = 8
    seed: int = 0
    quick: bool = False
    png: bool = True
    progress: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def out_dir(self) -> str:
        return self.out or f"report/{safe_name(self.model)}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["out"] = self.out_dir
        return d


# Applied by --quick unless the user set the value explicitly.
QUICK = dict(n=16, rank_n=8, fractions=(0.0, 0.15, 0.3), scores=("AWFT", "AHON (LN)"))


def quick(config: ReportConfig, explicit: set[str] = frozenset()) -> ReportConfig:
    """The ``--quick`` preset: small samples, two scores, three fractions; explicitly given values win."""
    return replace(config, quick=True, **{k: v for k, v in QUICK.items() if k not in explicit})


def safe_name(model: str) -> str:
    """A folder name for a model name or path (``gpt2-medium``, ``/path/to/folder`` -> ``folder``)."""
    return slug(model.rstrip("/").split("/")[-1] or "model", keep="-_.")
