"""The cells of the notebook on lens_heads inside lm-evaluation-harness: lm-eval running the ``lens_heads`` model type
unablated and under the paper's zeroing, and the same items through ``lh.load_task("lm_eval:...")`` and
``lh.evaluate`` (written by ``make_notebooks.py``; edit the cells here)."""

from nbformat.v4 import new_code_cell, new_markdown_cell

HARNESS = [
    new_markdown_cell("""# lens_heads inside lm-evaluation-harness

lens_heads is an lm-eval model type (`lens_heads.harness.LensHeadsLM`, registered as `lens_heads`), and any lm-eval
task is a lens_heads task (`lh.load_task("lm_eval:<task or YAML>")`). Here, on the embedded SmolLM2-135M-Instruct
and lm-eval's ARC-Easy format over the 30 local items the tests ship (`tests/data/lm_eval/arc_easy_local.yaml`, no
network): `lm_eval.simple_evaluate` unablated and with the paper's per-input zeroing of 10% of the heads by AHON (LN)
(thresholds calibrated on the run's own rows), lm-eval's results table with the share of heads zeroed its output
carries, then the same items through `lh.load_task` and `lh.evaluate`, which give the same numbers, and the paired
difference of the two evaluations. Thirty items make wide intervals: the point is the plumbing."""),
    new_code_cell("""import os
from pathlib import Path

import lm_eval
import pandas as pd
from lm_eval.tasks import TaskManager
from lm_eval.utils import make_table

import lens_heads as lh
from lens_heads.harness import LensHeadsLM

os.chdir(Path(lh.__file__).resolve().parents[1])  # the checkout: the YAML's data_files are relative to it
ARC = "tests/data/lm_eval/arc_easy_local.yaml"
model = lh.load_model()
manager = TaskManager(include_path="tests/data/lm_eval", include_defaults=False)  # the local YAMLs alone"""),
    new_markdown_cell("""## lm-eval runs lens_heads

`model_args` as the command line writes them (`ablation=threshold:AHON (LN):0.1`, or `static:SCORE:SHARE`,
`random:SHARE:per_row:SEED`, `heads=3.1;10.4`, `layers=23;24`) are `LensHeadsLM`'s keyword arguments; a loaded
model goes in as `pretrained`. lm-eval's own table of the ablated run:"""),
    new_code_cell("""SPECS = ["none", "threshold:AHON (LN):0.1"]
runs = {spec: lm_eval.simple_evaluate(model=LensHeadsLM(pretrained=model, ablation=spec, progress=False),
                                      tasks=["arc_easy_local"], task_manager=manager, log_samples=True)
        for spec in SPECS}
print(make_table(runs["threshold:AHON (LN):0.1"]))"""),
    new_markdown_cell("""The results' `config` holds `lens_heads`: the ablation, what it was calibrated to (the threshold, on the
unablated scores of the rows evaluated) and the share of heads it zeroed (each logged sample's `arguments` end with
its request's share):"""),
    new_code_cell("""pd.DataFrame([{"ablation": spec, "acc": run["results"]["arc_easy_local"]["acc,none"],
               "acc_stderr": run["results"]["arc_easy_local"]["acc_stderr,none"],
               "acc_norm": run["results"]["arc_easy_local"]["acc_norm,none"],
               "share_zeroed": run["config"]["lens_heads"]["share_zeroed"],
               "threshold": run["config"]["lens_heads"]["calls"][0].get("threshold")}
              for spec, run in runs.items()]).round(4)"""),
    new_markdown_cell("""## The same items in lens_heads

`lh.load_task("lm_eval:...")` takes lm-eval's requests (its rendering of each document), so `lh.evaluate` runs the
rows lm-eval's model ran. The threshold calibrated here on the task's unablated scores, the accuracies and every
choice's log-likelihood against lm-eval's logged samples:"""),
    new_code_cell("""import numpy as np

task = lh.load_task(f"lm_eval:{ARC}")
base = lh.evaluate(model, task, progress=False)
threshold = lh.thresholds(lh.score_heads(model, task, progress=False), "AHON (LN)", [0.1])[0.1]
ablated = lh.evaluate(model, task, hooks=lh.threshold_zeroing(model, "AHON (LN)", threshold), progress=False)
samples = sorted(runs["threshold:AHON (LN):0.1"]["samples"]["arc_easy_local"], key=lambda s: s["doc_id"])
theirs = [resp[0][0] for s in samples for resp in s["resps"]]
print(f"{len(task)} items; threshold {threshold:.4f} (lm-eval's run: "
      f"{runs['threshold:AHON (LN):0.1']['config']['lens_heads']['calls'][0]['threshold']:.4f})")
print(f"accuracy unablated {base.accuracy:.1%} (lm-eval {runs['none']['results']['arc_easy_local']['acc,none']:.1%}), "
      f"ablated {ablated.accuracy:.1%} (lm-eval "
      f"{runs['threshold:AHON (LN):0.1']['results']['arc_easy_local']['acc,none']:.1%})")
print("every choice's log-likelihood as lm-eval logged it (within 1e-4):",
      np.allclose(theirs, np.concatenate([r.logprobs for r in ablated.items]), rtol=0, atol=1e-4))"""),
    new_markdown_cell("""## The paired difference

The ablation against the unablated model on the same items (accuracy, the gold answer's log-probability, and the KL
between the two answer distributions), each with its 95% interval over items:"""),
    new_code_cell("""d = lh.paired_difference(ablated, base)
print(f"paired accuracy difference {d.mean:+.3f} (95% CI {d.ci95[0]:+.3f}..{d.ci95[1]:+.3f}, {d.method})")
print(f"gold log-prob change {d.gold_logprob_change.mean:+.3f} "
      f"(95% CI {d.gold_logprob_change.ci95[0]:+.3f}..{d.gold_logprob_change.ci95[1]:+.3f}), KL {d.kl.mean:.3f}")"""),
    new_markdown_cell("""## From the command line

The same ablated run as one command (lm-eval's command line with the model registered; lm-eval releases with plugin
discovery also take `lm_eval --model lens_heads ...` through the `lm_eval.models` entry point):

```bash
.venv/bin/python -m lens_heads.harness --model lens_heads --device cpu --batch_size 8 \\
    --model_args "ablation=threshold:AHON (LN):0.1" \\
    --tasks arc_easy_local --include_path tests/data/lm_eval --log_samples --output_path runs/lm_eval
```

`lm_eval:` tasks also run everywhere a lens_heads task does (`lh.score_heads`, `lh.run_sweep`, `lh.head_effects`,
`python -m lens_heads.report --quick --tasks lm_eval:tests/data/lm_eval/arc_easy_local.yaml`). How this differs from
the authors' patched-attention run: `docs/protocol.md`."""),
]
