"""The settings of an Inheritune run (`InherituneConfig`): the reference and student sizes, the growth rule, the
schedule, and the paper's baselines and ablations it trains at the final student size."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lens_heads.growth.gpt2 import PADDED_VOCAB, GPT2Options
from lens_heads.plumbing.errors import InputError
from lens_heads.training.config import TrainConfig
from lens_heads.training.distill import DistillConfig

# the paper's baselines and ablations at the final student size, each one stage (the warm starts after the stages
# they start from)
INHERITANCE_ABLATIONS = ("later_layers", "attention_only", "mlp_only")
WIDTH_BASELINES = ("half_width", "half_width_widened")  # the authors' half width, and lens_heads' warm start
STACKINGS = ("stacking", "hybrid_stacking", "stacking_2rnd")
WARM_STARTS = STACKINGS + ("half_width_widened",)
DISTILLATIONS = ("distill_logit", "distill_distilbert")
ABLATIONS = INHERITANCE_ABLATIONS + STACKINGS + WIDTH_BASELINES + DISTILLATIONS
GROW_FROM = ("student", "reference")  # keep the trained student and append reference blocks, or re-inherit
GROWTH = {"student": "the trained student grown by the reference's next blocks (the paper's recipe)",
          "reference": "a fresh re-inheritance of the reference's first blocks at each size (what the authors' "
                       "logs fit)"}
BASELINE_METHODS = {
    "later_layers": "inherit the reference's last n blocks (the lazy ones)",
    "attention_only": "inherit ln1 + attention of the first n blocks, the rest fresh",
    "mlp_only": "inherit ln2 + MLP of the first n blocks, the rest fresh",
    "stacking": "scratch n/2 layers trained, its blocks repeated to n, trained (Gong et al. 2019)",
    "hybrid_stacking": "the same n/2-layer source's blocks at even depths, fresh blocks between, trained",
    "stacking_2rnd": "two rounds of stacking (Gong et al. 2019; the authors' *_stacking_2rnd logs): scratch n/4 "
                     "layers trained, stacked to n/2 and trained, stacked to n and trained",
    "half_width": "fresh init, n layers at half the width, trained (the authors' half-width baseline: their "
                  "medium_halfwdth log starts at the loss of a fresh model)",
    "half_width_widened": "the trained half-width model doubled function-preservingly (Net2WiderNet), trained "
                          "(lens_heads' warm start)",
    "distill_logit": "fresh n layers trained on the reference's logits (T^2 KL at temperature T) mixed with the LM loss",
    "distill_distilbert": "DistilBERT: evenly spaced reference blocks + embeddings, trained with soft, LM and cosine "
                          "losses",
}


@dataclass(frozen=True)
class InherituneConfig:
    """Sizes and schedule of an Inheritune run. ``train_config`` is used for every stage (same steps for each).

    ``ref_steps``: the reference's training steps (default ``train_config.steps``, as every other stage); a reference trained
    longer than a student stage is one the first student does not already match, so the run grows.
    ``grow_from``: ``"student"`` (default, the paper's recipe) keeps the trained student and appends the
    reference's next blocks; ``"reference"`` re-inherits the first n blocks at each size.
    ``ablations``: the paper's baselines and ablations at the final student size (`BASELINE_METHODS`), each one
    stage (a row of the table), trained with the same loop and steps; the warm starts first train their source
    (``stack_source``: scratch at half the depth, shared by stacking and hybrid stacking; for ``stacking_2rnd``
    scratch at a quarter of the depth and its first round stacked to half; for
    ``half_width_widened`` the trained ``half_width`` model, or a ``width_source`` stage where ``half_width`` is not
    asked for), whose budget the table adds to theirs. ``distill_logit`` / ``distill_distilbert``: the
    losses of the two distillation baselines (the trained reference is the teacher). ``widen_noise``: the noise that
    breaks the copies' symmetry in the half-width warm start. ``options``: the GPT-2 architecture (authors' default).
    """

    ref_layers: int = 8
    student_layers: int = 4
    grow_by: int = 2
    max_layers: int | None = None  # largest student; default ref_layers - 1
    d_model: int = 128
    n_heads: int = 4
    n_ctx: int = 128
    d_vocab: int = PADDED_VOCAB
    options: GPT2Options = field(default_factory=GPT2Options)
    train_config: TrainConfig = field(default_factory=TrainConfig)
    grow_from: str = "student"
    ref_steps: int | None = None  # the reference's steps (default train_config.steps): a longer-trained reference to grow to
    baselines: bool = True  # same-size scratch models for 1x and 2x steps
    ablations: tuple[str, ...] = ABLATIONS
    distill_logit: DistillConfig = field(default_factory=DistillConfig.logit)
    distill_distilbert: DistillConfig = field(default_factory=DistillConfig.distilbert)
    widen_noise: float = 1e-3
    rank_inputs: int = 32  # N validation windows for attention rank
    rank_len: int = 64  # T tokens each
    rank_every: int | None = None  # also track rank during training every this many steps
    rank_average: bool = True  # the paper's rank: of the input-averaged matrix (False: mean of per-input ranks)
    seed: int = 0
    device: str | None = None

    def __post_init__(self):
        check_config(self)  # refused where it is built, not stages later


def check_config(c: InherituneConfig) -> int:
    """The largest student size; errors for sizes the reference cannot provide."""
    max_layers = c.max_layers or c.ref_layers - 1
    if max_layers > c.ref_layers:
        raise InputError(f"max_layers={max_layers} exceeds the reference's {c.ref_layers} layers: growing cannot "
                         "pass the reference")
    if not 0 < c.student_layers <= max_layers:
        raise InputError(f"student_layers={c.student_layers} must be in 1..{max_layers} (max_layers)")
    unknown = set(c.ablations) - set(ABLATIONS)
    if unknown:
        raise InputError(f"unknown ablations {sorted(unknown)}: choose from {ABLATIONS}")
    if c.grow_by < 1:  # growing by 0 would train the same size forever
        raise InputError(f"grow_by={c.grow_by} must be at least 1 (layers added per growth stage)")
    if c.ref_steps is not None and c.ref_steps < 1:
        raise InputError(f"ref_steps={c.ref_steps} must be at least 1 (the reference's training steps), or None for "
                         "the students' steps")
    if c.grow_from not in GROW_FROM:
        raise InputError(f"grow_from={c.grow_from!r} must be one of {GROW_FROM}")
    if set(WIDTH_BASELINES) & set(c.ablations):
        half_width_shape(c.d_model, c.n_heads)
    return max_layers


def reference_train(c: InherituneConfig) -> TrainConfig:
    """The reference's training settings: ``c.train_config`` with ``c.ref_steps`` steps where given."""
    if c.ref_steps is None:
        return c.train_config
    return TrainConfig(**{**asdict(c.train_config), "steps": c.ref_steps})


def half_width_shape(d_model: int, n_heads: int) -> tuple[int, int]:
    """(d_model, n_heads) of the half-width source of a ``d_model``-wide model with ``n_heads`` heads: half the
    heads at the same d_head, or (an odd number of heads, as GPT-2 XL's 25) the same heads at half the d_head."""
    if d_model % 2:
        raise InputError(f"d_model={d_model} is odd: the half-width baselines need a width that halves (or "
                         f"leave {' and '.join(WIDTH_BASELINES)} out of the ablations)")
    # an even width with an odd number of heads has an even d_head
    return (d_model // 2, n_heads // 2) if n_heads % 2 == 0 else (d_model // 2, n_heads)
