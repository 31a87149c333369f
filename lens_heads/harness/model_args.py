"""The ablation of an lm-eval ``lens_heads`` model, as its ``model_args`` write it, checked before any forward.

lm-eval splits ``model_args`` at commas, so lists use ``;`` and the parts of an ablation ``:``:

- ``ablation=threshold:SCORE:SHARE``: the paper's per-input zeroing (:func:`lens_heads.threshold_zeroing`) at the
  threshold that puts ``SHARE`` of the unablated scores on the inactive side; ``thresholds=PATH`` reads it from an
  authors'-format ``thresholds.json`` (:func:`lens_heads.load_thresholds`; ``thresholds_task=`` where it holds
  several tasks) instead of calibrating.
- ``ablation=static:SCORE:SHARE``: the ``round(SHARE x heads)`` heads of the most inactive mean score, zeroed for
  every input (:func:`lens_heads.static_zeroing`).
- ``ablation=random:SHARE[:DRAW[:SEED]]``: each (input, layer, head) zeroed with probability ``SHARE``
  (:func:`lens_heads.random_zeroing`; ``DRAW`` ``per_item`` (default) or ``per_row``, the authors' baseline).
- ``heads=3.1;10.4``: these (layer, head) pairs zeroed for every input (:func:`lens_heads.static_zeroing`). lm-eval
  reads a lone pair as a number, so one whose head ends in 0 needs a trailing ``;`` (``heads=3.10;``: 3.10 is 3.1).
- ``layers=23;24`` with ``layer_part=attention|block``: whole layers removed (:func:`lens_heads.remove_layers`).

Each form is one of the sweep's ablation specs (:meth:`AblationArgs.to_spec`, :mod:`lens_heads.ablation.specs`),
resolved against a calibration and built as a sweep builds its units (:func:`build_hooks`).

Calibrated thresholds and static head sets follow the authors' protocol: the unablated scores of exactly the rows
the evaluation then runs, here every request of the call (lm-eval sends all the ``loglikelihood`` requests of a run,
every task together, in one call; a ``generate_until`` call calibrates on its prompts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lens_heads.ablation.hooks import DRAWS
from lens_heads.ablation.removed_layers import PARTS
from lens_heads.ablation.specs import (
    AblationSpec,
    LayerRemoval,
    RandomAblation,
    ScoreCalibration,
    StaticAblation,
    ThresholdAblation,
    Unablated,
)
from lens_heads.evaluation.ablation_interface import UnitAblation
from lens_heads.heads.scores import EXTRA_NAMES, SCORE_NAMES
from lens_heads.heads.scoring import score_heads
from lens_heads.heads.thresholds_file import load_thresholds
from lens_heads.plumbing.errors import InputError

FORMS = ("threshold:SCORE:SHARE", "static:SCORE:SHARE", "random:SHARE[:per_item|per_row[:SEED]]")


@dataclass(frozen=True)
class AblationArgs:
    """What to remove, parsed from ``model_args``: at most one of an ablation form, heads and layers."""

    form: str | None = None  # "threshold" | "static" | "random" | "heads" | "layers"; None: unablated
    score: str | None = None
    share: float | None = None
    draw: str = "per_item"
    seed: int = 0
    heads: tuple[tuple[int, int], ...] = ()
    layers: tuple[int, ...] = ()
    layer_part: str = "attention"
    thresholds: str | None = None
    thresholds_task: str | None = None

    @property
    def spec(self) -> str:
        """The ablation as the model_args wrote it (what lm-eval's output records)."""
        if self.form in ("threshold", "static"):
            return f"{self.form}:{self.score}:{self.share:g}" + (f" (thresholds {self.thresholds})"
                                                                  if self.thresholds else "")
        if self.form == "random":
            return f"random:{self.share:g}:{self.draw}:{self.seed}"
        if self.form == "heads":
            return "heads=" + ";".join(f"{layer}.{head}" for layer, head in self.heads)
        if self.form == "layers":
            return "layers=" + ";".join(map(str, self.layers)) + f" ({self.layer_part})"
        return "none"

    @property
    def needs_scores(self) -> bool:
        """The hooks depend on unablated head scores of the evaluated rows."""
        return self.form == "static" or (self.form == "threshold" and self.thresholds is None)

    def to_dict(self) -> dict:
        return dict(asdict(self), spec=self.spec)

    def to_spec(self) -> AblationSpec:
        """The form as the sweep's ablation spec: ``threshold`` and ``static`` still to be resolved against a
        calibration (:func:`build_hooks`), the others ready to build."""
        if self.form == "threshold":
            assert self.score is not None and self.share is not None
            return ThresholdAblation(self.score, self.share)
        if self.form == "static":
            return StaticAblation(score=self.score, fraction=self.share)
        if self.form == "random":
            assert self.share is not None
            return RandomAblation(self.share, seed=self.seed, draw=self.draw)
        if self.form == "heads":
            return StaticAblation(heads=self.heads)
        if self.form == "layers":
            return LayerRemoval(self.layers, part=self.layer_part)
        return Unablated()


def parse_ablation(ablation: str | None = None, heads: str | int | float | None = None,
                   layers: str | int | None = None, layer_part: str = "attention", thresholds: str | None = None,
                   thresholds_task: str | None = None) -> AblationArgs:
    """``model_args``' ablation keys as an :class:`AblationArgs`, or an InputError saying what to write."""
    given = [key for key, value in (("ablation", ablation), ("heads", heads), ("layers", layers)) if value is not None]
    if len(given) > 1:
        raise InputError(f"give one of ablation=, heads= and layers=, not {' and '.join(given)}")
    if layer_part not in PARTS:
        raise InputError(f"layer_part must be one of {'|'.join(PARTS)}, got {layer_part!r}")
    if thresholds is not None and not str(ablation or "").startswith("threshold:"):
        raise InputError("thresholds= gives the thresholds of ablation=threshold:SCORE:SHARE: add that ablation")
    if heads is not None:
        return AblationArgs(form="heads", heads=_heads(str(heads)))
    if layers is not None:
        return AblationArgs(form="layers", layers=_ints(str(layers), "layers"), layer_part=layer_part)
    if ablation is None or str(ablation) in ("", "none"):
        return AblationArgs()
    return _ablation(str(ablation), thresholds, thresholds_task)


def _ablation(text: str, thresholds: str | None, thresholds_task: str | None) -> AblationArgs:
    form, *parts = [p.strip() for p in text.split(":")]
    if form in ("threshold", "static"):
        if len(parts) != 2:
            raise InputError(f"ablation={text!r}: write {form}:SCORE:SHARE, e.g. {form}:AHON (LN):0.1")
        score, share = parts
        if score not in SCORE_NAMES + EXTRA_NAMES:
            raise InputError(f"ablation={text!r}: unknown score {score!r}; the scores are "
                             f"{', '.join(SCORE_NAMES + EXTRA_NAMES)}")
        return AblationArgs(form=form, score=score, share=_share(share, text), thresholds=thresholds,
                            thresholds_task=thresholds_task)
    if form == "random":
        if not 1 <= len(parts) <= 3:
            raise InputError(f"ablation={text!r}: write random:SHARE[:per_item|per_row[:SEED]], e.g. random:0.1:per_row:0")
        draw = parts[1] if len(parts) > 1 else "per_item"
        if draw not in DRAWS:
            raise InputError(f"ablation={text!r}: the draw is one of {', '.join(DRAWS)}, got {draw!r}")
        seed = _ints(parts[2], "the random seed")[0] if len(parts) > 2 else 0
        return AblationArgs(form="random", share=_share(parts[0], text), draw=draw, seed=seed)
    raise InputError(f"ablation={text!r}: unknown ablation form {form!r}; the forms are {', '.join(FORMS)} "
                     "(or heads=L.H;L.H, layers=L;L with layer_part=attention|block)")


def _share(text: str, where: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise InputError(f"ablation={where!r}: the share {text!r} is not a number: give a fraction in [0, 1), "
                         "e.g. 0.1 for 10% of the heads") from None
    if not 0.0 <= share < 1.0:  # NaN fails this too
        raise InputError(f"ablation={where!r}: the share {share:g} is outside [0, 1): give a fraction of the heads, "
                         "e.g. 0.1 for 10% (percent are not read)")
    return share


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.replace(",", ";").split(";") if part.strip())
    except ValueError:
        raise InputError(f"{what}={text!r}: give integers separated by ';' (lm-eval splits model_args at commas), "
                         "e.g. layers=23;24") from None


def _heads(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in (p.strip() for p in text.split(";") if p.strip()):
        layer, dot, head = part.partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise InputError(f"heads={text!r}: write LAYER.HEAD pairs separated by ';', e.g. heads=3.1;10.4")
        out.append((int(layer), int(head)))
    if not out:
        raise InputError("heads= is empty: name at least one LAYER.HEAD pair")
    return tuple(out)


def check_against(args: AblationArgs, model) -> None:
    """Refuse heads, layers or a thresholds file that don't fit ``model``, before anything runs."""
    if args.form in ("heads", "layers"):
        args.to_spec().build(model)  # refuses a head or a layer the model lacks
    elif args.form == "threshold" and args.thresholds is not None:
        args.to_spec().resolve(load_thresholds(args.thresholds, model, task=args.thresholds_task))


def build_hooks(args: AblationArgs, model, rows, *, batch_size: int | str = 8) -> tuple[UnitAblation | None, dict]:
    """The ablation of ``args`` for ``model`` (None: unablated) and what it was calibrated to (threshold, heads):
    its spec resolved against the thresholds file or the unablated scores of ``rows`` (a Task: its evaluation rows;
    or prompts) and built, as a sweep resolves and builds its units."""
    spec = args.to_spec()
    if args.thresholds is not None:
        resolved = spec.resolve(load_thresholds(args.thresholds, model, task=args.thresholds_task))
        assert isinstance(resolved, ThresholdAblation)
        return resolved.build(model), dict(threshold=resolved.threshold, calibration=args.thresholds)
    if not args.needs_scores:
        return spec.build(model), {}
    assert args.score is not None
    scores = score_heads(model, rows, batch_size=batch_size, progress=False,
                         extras=[args.score] if args.score in EXTRA_NAMES else ())
    resolved = spec.resolve(ScoreCalibration(scores))
    where = dict(calibration=f"unablated scores of the {len(scores)} rows evaluated")
    if isinstance(resolved, ThresholdAblation):
        return resolved.build(model), dict(where, threshold=resolved.threshold)
    assert isinstance(resolved, StaticAblation) and resolved.heads is not None
    return resolved.build(model), dict(where, heads=[list(h) for h in resolved.heads])
