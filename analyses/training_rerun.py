"""Recorded training runs made again by the one training loop: their loss curves against the recorded ones.

    python analyses/training_rerun.py --finetune FOLDER --baselines RUNS

``--finetune``: the folder step 1 of ``analyses/model_distributions.py`` wrote (under its ``--cache``; a fresh
``--cache`` trains anew), compared with the ``finetune`` entry of ``distributions_arc_easy.json``: the training loss
of every step and the held-out loss at every evaluation. ``--baselines``: an ``analyses/inheritune_baselines.py``
``--runs`` folder trained anew; every stage of every seed found there (``seed_<s>/stages.json``) is compared with the
recorded validation-loss history and final loss of that seed and stage in ``inheritune_baselines.json``; the stages
it lacks are listed as not made again. ``--code-pair OLD,NEW``: two ``--runs`` folders of
``inheritune_baselines.py`` with the same (small) settings, made by the recording's commit and by this one on the same
machine: every stage's validation-loss history compared, which tells a change of the code from one of the machine.
``--finetune-pair OLD,NEW``: the same for two fine-tune folders of the same (short) settings: their training and
held-out losses, and whether their weights are the same bytes.

Each curve: the points compared, how many are equal to the last bit, the largest absolute and relative difference and
the first step that differs. Writes ``training_rerun.json`` to ``--figures``.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.training.finetune import RECORD

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RerunSettings:
    """The runs made again and where the recordings are (each field is a ``--flag``)."""

    finetune: str | None = option(None, "the fine-tune's folder made again (model_distributions.py --cache)")
    baselines: str | None = option(None, "inheritune_baselines.py --runs folder trained again")
    code_pair: tuple[str, ...] = option((), "two inheritune_baselines.py --runs folders, same settings, made at the "
                                        "recording's commit and at this one (comma-separated)")
    finetune_pair: tuple[str, ...] = option((), "two fine-tune folders, same settings, made at the recording's commit "
                                            "and at this one (comma-separated)")
    code_pair_commits: tuple[str, ...] = option((), "the commits the pairs' folders were made at (old,new), as the "
                                                "record states them")
    figures: str = option(str(ROOT / "figures"), "where the recordings are read and training_rerun.json goes")


def compare(steps: list[int], recorded: list[float], rerun: list[float]) -> dict:
    """Two curves over the same ``steps``, point by point."""
    if len(recorded) != len(rerun):
        raise InputError(f"the curves have {len(recorded)} and {len(rerun)} points: make the run again with the "
                         "recorded settings")
    if not all(math.isfinite(v) for v in [*recorded, *rerun]):
        raise InputError("a loss is not finite: the run diverged, nothing to compare")
    diffs = [b - a for a, b in zip(recorded, rerun)]
    differing = [s for s, d in zip(steps, diffs) if d != 0]
    return {"points": len(steps), "equal": len(steps) - len(differing),
            "max_abs_difference": max((abs(d) for d in diffs), default=0.0),
            "max_rel_difference": max((abs(d) / abs(a) for d, a in zip(diffs, recorded) if a), default=0.0),
            "first_differing_step": differing[0] if differing else None,
            "last_recorded": recorded[-1] if recorded else None, "last_rerun": rerun[-1] if rerun else None}


def read(path: Path) -> dict:
    if not path.exists():
        raise InputError(f"{path} does not exist: give --figures the folder of the recordings, and the folders the "
                         "runs made again wrote")
    return json.loads(path.read_text())


def finetune_curves(folder: Path, figures: Path) -> dict:
    """The fine-tune's training and held-out loss curves against the recorded ones."""
    recorded = read(figures / "distributions_arc_easy.json")["finetune"]
    rerun = read(folder / RECORD)
    # a recording made before the one config names fewer fields: each it names must match
    if any(rerun["config"].get(k) != v for k, v in recorded["config"].items()):
        raise InputError(f"{folder} was fine-tuned with other settings than the recording: give the folder of a "
                         "run with model_distributions.py's defaults")
    if rerun["eval_steps"] != recorded["eval_steps"]:
        raise InputError(f"{folder} evaluated at steps {rerun['eval_steps']}, the recording at "
                         f"{recorded['eval_steps']}")
    return {"recording": "distributions_arc_easy.json", "config": recorded["config"],
            "train_loss": compare(list(range(1, len(recorded["train_loss"]) + 1)), recorded["train_loss"],
                                  rerun["train_loss"]),
            "held_out_loss": compare(recorded["eval_steps"], recorded["eval_loss"], rerun["eval_loss"])}


def baseline_curves(runs: Path, figures: Path) -> dict:
    """Every stage found in ``runs`` against the recorded history and final loss of its seed and stage."""
    recorded = read(figures / "inheritune_baselines.json")
    rows = {(r["seed"], r["stage"]): r for r in recorded["per_seed"]}
    compared, made = [], set()
    for path in sorted(runs.glob("seed_*/stages.json")):
        seed = int(path.parent.name.removeprefix("seed_"))
        for stage in json.loads(path.read_text()):
            row = rows.get((seed, stage["name"]))
            if row is None:
                continue  # a warm start's source: not among the recorded methods
            made.add((seed, stage["name"]))
            history = recorded["histories"][str(seed)][row["method"]]
            mine = {h["step"]: h["val_loss"] for h in stage["history"] if "val_loss" in h}
            steps = [h["step"] for h in history if "val_loss" in h]
            if set(steps) - set(mine):
                raise InputError(f"{path}: {stage['name']} has no validation loss at steps "
                                 f"{sorted(set(steps) - set(mine))}: make the run with the recorded settings")
            compared.append({"seed": seed, "stage": stage["name"], "method": row["method"],
                             "val_loss_history": compare(steps, [h["val_loss"] for h in history if "val_loss" in h],
                                                         [mine[s] for s in steps]),
                             "final_val_loss": compare([stage["steps"]], [row["val_loss"]], [stage["val_loss"]]),
                             "tokens_seen_equal": stage["tokens_seen"] == row["tokens_seen"]})
    return {"recording": "inheritune_baselines.json", "settings": recorded["settings"], "stages": compared,
            "not_made_again": [f"seed {s} {name}" for s, name in sorted(rows) if (s, name) not in made]}


def stages_of(seed_folder: Path) -> dict[str, dict]:
    """A seed's stages by name: its finished run's ``result.json``, else the stages trained so far."""
    done = seed_folder / "result.json"
    stages = read(done)["stages"] if done.exists() else read(seed_folder / "stages.json")
    return {s["name"]: s for s in stages}


def code_pair(old: Path, new: Path) -> dict:
    """Every stage both folders hold, the new run's validation losses against the old run's."""
    rows = []
    for folder in sorted(old.glob("seed_*")):
        before, after = stages_of(folder), stages_of(new / folder.name)
        for name in [n for n in before if n in after]:
            steps = [h["step"] for h in before[name]["history"] if "val_loss" in h]
            mine = {h["step"]: h["val_loss"] for h in after[name]["history"] if "val_loss" in h}
            if set(steps) - set(mine):
                raise InputError(f"{new / folder.name}: {name} has no validation loss at steps "
                                 f"{sorted(set(steps) - set(mine))}: give two runs of the same settings")
            rows.append({"seed": int(folder.name.removeprefix("seed_")), "stage": name,
                         "val_loss_history": compare(steps, [h["val_loss"] for h in before[name]["history"]
                                                             if "val_loss" in h], [mine[s] for s in steps])})
    if not rows:
        raise InputError(f"{old} and {new} hold no stage in common: give two --runs folders of the same settings")
    first = new / f"seed_{rows[0]['seed']}" / rows[0]["stage"] / "key.json"  # the first stage's sizes and schedule
    return {"old": str(old), "new": str(new), "stages": rows, "first_stage_key": read(first)["key"]
            if first.exists() else None}


def finetune_pair(old: Path, new: Path) -> dict:
    """Two fine-tunes of the same settings: the new one's losses against the old one's, and their weights' bytes."""
    before, after = read(old / RECORD), read(new / RECORD)
    if before["config"] != {k: after["config"].get(k) for k in before["config"]} or \
            before["eval_steps"] != after["eval_steps"]:
        raise InputError(f"{old} and {new} were fine-tuned with other settings: give two folders of the same run")
    return {"old": str(old), "new": str(new), "config": before["config"],
            "train_loss": compare(list(range(1, len(before["train_loss"]) + 1)), before["train_loss"],
                                  after["train_loss"]),
            "held_out_loss": compare(before["eval_steps"], before["eval_loss"], after["eval_loss"]),
            "weights_equal": (old / "model.safetensors").read_bytes() == (new / "model.safetensors").read_bytes()}


def main(argv=None) -> dict:
    args = from_args(RerunSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if args.finetune is None and args.baselines is None and not args.code_pair and not args.finetune_pair:
        raise SystemExit("nothing to compare: give --finetune, --baselines, --code-pair or --finetune-pair")
    for name in ("code_pair", "finetune_pair"):
        if getattr(args, name) and len(getattr(args, name)) != 2:
            raise SystemExit(f"--{name.replace('_', '-')} takes two folders (old,new), got {len(getattr(args, name))}")
    figures = Path(args.figures)
    record = {"what": "recorded training runs made again by the one training loop, their loss curves compared point "
                      "by point with the recorded ones (difference = made again - recorded)",
              "settings": asdict(args)}
    if args.finetune is not None:
        record["finetune"] = finetune_curves(Path(args.finetune), figures)
    if args.baselines is not None:
        record["baselines"] = baseline_curves(Path(args.baselines), figures)
    if args.code_pair:
        record["code_pair"] = {**code_pair(*(Path(p) for p in args.code_pair)),
                               "commits": dict(zip(("old", "new"), args.code_pair_commits))}
    if args.finetune_pair:
        record["finetune_pair"] = {**finetune_pair(*(Path(p) for p in args.finetune_pair)),
                                   "commits": dict(zip(("old", "new"), args.code_pair_commits))}
    write_record(figures / "training_rerun.json", record)
    curves = [("fine-tune " + name, record["finetune"][name]) for name in ("train_loss", "held_out_loss")
              if "finetune" in record]
    curves += [(f"seed {s['seed']} {s['stage']} validation loss", s["val_loss_history"])
               for s in record.get("baselines", {}).get("stages", [])]
    curves += [(f"fine-tune pair: {name}", record["finetune_pair"][name]) for name in ("train_loss", "held_out_loss")
               if "finetune_pair" in record]
    curves += [(f"code pair: seed {s['seed']} {s['stage']} validation loss", s["val_loss_history"])
               for s in record.get("code_pair", {}).get("stages", [])]
    for name, c in curves:
        print(f"{name}: {c['equal']}/{c['points']} points equal, largest relative difference "
              f"{c['max_rel_difference']:.2g} (first differing step {c['first_differing_step']})")
    return record


if __name__ == "__main__":
    main()
