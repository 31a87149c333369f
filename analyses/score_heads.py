"""Score every head of a model on MMLU, PIQA and WinoGrande samples: distributions, thresholds, heatmaps.

    python analyses/score_heads.py                      # embedded SmolLM2-135M, ~5 min on 2 CPU cores
    python analyses/score_heads.py --model gpt2-medium --n-mmlu 500 --n-piqa 500 --n-winogrande 500

Writes to ``--out`` (default ``figures/``):
  score_distributions.csv   per data set, score and layer: mean, std, quantiles over (input, head) values
  score_thresholds.csv      per data set and score: thresholds at the paper's target fractions of heads
  heatmap_<score>.png       layer x head heatmap of each of the twelve scores (mean over the first data set)
  score_heatmaps.html/.png  all twelve in one interactive page (plotly inlined, works offline) and one image
  score_heads_run.json      the settings, model and data of this run
Scores of each data set are kept in ``--cache`` (outside the repository) and reused by a rerun with the same settings.
Stability across tasks (the paper's "stable across data" claim, with intervals and tests): analyses/score_stability.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lens_heads import load_model, load_task
from lens_heads.heads.distributions import layer_summary, thresholds
from lens_heads.heads.scores import SCORE_NAMES
from lens_heads.heads.scoring import HeadScores, score_heads
from lens_heads.models.embedded import cache_dir
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.io import atomic_write_text, slug
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option

FRACTIONS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ScoreSettings:
    """The model, the samples scored and where the outputs go."""

    model: str = option("smollm2-135m", "embedded default, TransformerLens name or HF folder")
    n_mmlu: int = option(8, "MMLU test items (5-shot prompts: ~800 tokens on average)")
    n_piqa: int = option(128, "PIQA items")
    n_winogrande: int = option(128, "WinoGrande items")
    mmlu_shots: int = option(5, "MMLU few-shot examples")
    seed: int = option(0, "seed of the item samples")
    batch_size: int = option(4, "MMLU inputs per forward (batches are grouped by length)")
    batch_size_short: int = option(32, "PIQA/WinoGrande inputs per forward (short)")
    out: Path = option(ROOT / "figures", "where tables and figures go", parse=Path)
    cache: Path = option(help="where per-data-set scores are kept for reruns (LENS_HEADS_CACHE/scores)", parse=Path,
                         default_factory=lambda: cache_dir() / "scores")
    no_png: bool = option(False, "skip PNGs (kaleido needs Chromium)")


def scores_for(model, model_name: str, task_name: str, n: int, shots: int | None, seed: int, batch_size: int,
               cache: Path) -> HeadScores:
    """Scores of one data set sample, from the cache when this exact sample was scored before."""
    task = load_task(task_name, n=n, seed=seed, shots=shots)
    key = dict(model=model_name, task=task_name, n=len(task), shots=task.shots, seed=seed)

    def compute(path: Path) -> None:
        t = time.perf_counter()
        result = score_heads(model, task, batch_size=batch_size)
        print(f"[{task_name}] {len(task)} items ({task.shots}-shot), {result.meta['data']['n_tokens']} tokens, "
              f"{time.perf_counter() - t:.0f} s")
        result.save(path)

    return Cache(cache).file(f"scores-{slug(model_name.lower())}-{task_name}", key, ".safetensors", compute,
                             HeadScores.load)


def main(argv=None) -> None:
    args = from_args(ScoreSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = load_model(args.model)
    sizes = {"mmlu": (args.n_mmlu, args.mmlu_shots), "piqa": (args.n_piqa, None),
             "winogrande": (args.n_winogrande, None)}
    batch = {"mmlu": args.batch_size, "piqa": args.batch_size_short, "winogrande": args.batch_size_short}
    sets = {name: scores_for(model, args.model, name, n, shots, args.seed, batch[name], args.cache)
            for name, (n, shots) in sizes.items() if n > 0}
    if not sets:
        sys.exit("nothing to score: give at least one of --n-mmlu/--n-piqa/--n-winogrande a positive size")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    dist = pd.concat([layer_summary(s).assign(data=name) for name, s in sets.items()], ignore_index=True)
    dist = dist[["data"] + [c for c in dist.columns if c != "data"]]
    atomic_write_text(out / "score_distributions.csv", dist.to_csv(index=False, float_format="%.6g"))
    thr = pd.DataFrame([dict(data=name, score=score, direction=s.direction[score], fraction=p, threshold=t)
                        for name, s in sets.items() for score in SCORE_NAMES
                        for p, t in thresholds(s, score, FRACTIONS).items()])
    atomic_write_text(out / "score_thresholds.csv", thr.to_csv(index=False, float_format="%.6g"))
    first = next(iter(sets))
    means = {name: sets[first].mean(name).numpy() for name in SCORE_NAMES}
    written = _figures(means, sets[first], first, model_meta(model), out, png=not args.no_png)
    meta = model_meta(model)
    write_record(out / "score_heads_run.json", dict(
        script="analyses/score_heads.py", argv=sys.argv[1:] if argv is None else list(argv), model=meta,
        data={name: s.meta["data"] for name, s in sets.items()}, heatmaps_from=first, fractions=FRACTIONS,
        definitions=next(iter(sets.values())).meta.get("definitions"), files=sorted(written)))
    print(f"\nwrote {len(written)} figures and 2 tables to {out}")


def _figures(means: dict, scores: HeadScores, data: str, meta: dict, out: Path, *, png: bool) -> list[str]:
    from lens_heads.viz.export import PngUnavailable, png_writer
    from lens_heads.viz.score_figures import score_heatmaps

    title = (f"{meta.get('name')}: head scores, mean over {len(scores)} {data} inputs; weight basis: "
             f"{meta.get('weight_basis')}; dark = inactive side")
    grid = score_heatmaps(means, scores.direction, title=title)
    import plotly.io as pio

    atomic_write_text(out / "score_heatmaps.html", pio.to_html(grid, include_plotlyjs=True, full_html=True))
    written = ["score_heatmaps.html"]
    if not png:
        return written
    try:
        with png_writer() as write:
            write(grid, out / "score_heatmaps.png")
            written.append("score_heatmaps.png")
            for name, m in means.items():
                fig = score_heatmaps({name: m}, scores.direction, title=f"{name}: mean over {len(scores)} {data} inputs")
                fig.update_traces(showscale=True, colorbar=dict(thickness=14))
                fig.update_layout(width=560, height=560)
                write(fig, out / f"heatmap_{slug(name.lower())}.png")
                written.append(f"heatmap_{slug(name.lower())}.png")
    except PngUnavailable as err:  # no Chromium: keep the HTML and tables, say how to get the PNGs
        print(f"PNG figures skipped ({err}); or pass --no-png", file=sys.stderr)
    return written


if __name__ == "__main__":
    main()
