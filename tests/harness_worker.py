"""One ``python -m lens_heads.harness`` run of tests/test_faults_harness.py, in its own process.

    python tests/harness_worker.py CONFIG.json

CONFIG: ``folder`` (a tiny model folder), ``out`` (``--output_path``), ``ready`` (a file written where the run
waits for the test's signal), ``pause`` (``"evaluating"``: inside the model's first request; ``"writing"``: after
lm-eval has written its first samples file; ``null``: no pause). lm-eval's built-in tasks are not indexed (~40 s):
only the repository's task YAMLs.
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(path: str) -> None:
    import torch
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from lens_heads.harness.__main__ import main as harness
    from lens_heads.harness.lm import LensHeadsLM

    torch.set_num_threads(1)
    config = json.loads(Path(path).read_text())
    init = TaskManager.__init__
    TaskManager.__init__ = lambda self, *a, **k: init(self, *a, **{**k, "include_defaults": False})

    def pausing(function):
        def wrapped(*args, **kwargs):
            result = function(*args, **kwargs)
            Path(config["ready"]).write_text("ready")
            time.sleep(120)  # the signal arrives here
            return result
        return wrapped

    if config["pause"] == "evaluating":
        LensHeadsLM.loglikelihood = pausing(LensHeadsLM.loglikelihood)
    elif config["pause"] == "writing":
        EvaluationTracker.save_results_samples = pausing(EvaluationTracker.save_results_samples)
    harness(["--model", "lens_heads", "--model_args", f"pretrained={config['folder']},device=cpu",
             "--tasks", "arc_easy_local", "--include_path", str(ROOT / "tests" / "data" / "lm_eval"),
             "--limit", "3", "--batch_size", "2", "--log_samples", "--output_path", config["out"]])


if __name__ == "__main__":
    main(sys.argv[1])
