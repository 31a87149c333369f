"""One long run of tests/test_faults.py, in its own process: a sweep of a tiny model into a folder.

    python tests/signal_worker.py CONFIG.json

CONFIG: ``out`` (the sweep's unit folder), ``result`` (where the finished sweep's units are written), ``n`` (items);
optional ``pause_after``: after that many units this run writes ``ready`` beside ``result`` and waits in the middle
of its next unit for the signal the test sends. Each unit this process stores is logged in ``result + ".log"``
(as a job array task, ``SLURM_ARRAY_TASK_*`` in the environment, the sweep returns None until all are done).
"""

import json
import sys
import time
from pathlib import Path

import torch

from conftest import text_model

SETTINGS = dict(scores=["AWFT", "AHON (LN)"], fractions=[0.0, 0.2, 0.4], seed=3, batch_size=4, progress=False,
                stack=1)  # one unit per evaluate(), which the pause and the tests count


def main(path: str) -> None:
    import lens_heads.sweep.run as sweep_module
    from lens_heads.data.tasks import load_task
    from lens_heads.evaluation.evaluate import evaluate

    config = json.loads(Path(path).read_text())
    torch.set_num_threads(1)
    model, task = text_model(n_layers=3), load_task("arc_easy", split="validation", n=config["n"], seed=1)
    if "pause_after" in config:
        done = []

        def pausing(*args, **kwargs):
            if len(done) == config["pause_after"]:
                Path(config["result"] + ".ready").write_text("ready")
                time.sleep(120)  # the signal arrives here, in the middle of a unit
            done.append(1)
            return evaluate(*args, **kwargs)

        sweep_module.evaluate = pausing
    save = sweep_module.UnitStore.save

    def logged(store, spec, unit):
        save(store, spec, unit)
        with open(config["result"] + ".log", "a") as log:
            log.write(json.dumps(spec.to_dict()) + "\n")

    sweep_module.UnitStore.save = logged
    result = sweep_module.run_sweep(model, task, out_dir=config["out"], **SETTINGS)
    Path(config["result"]).write_text(json.dumps(None if result is None else dict(
        units=[u.to_dict() for u in result.units], meta=result.meta)))


if __name__ == "__main__":
    main(sys.argv[1])
