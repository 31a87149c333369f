"""One torchrun rank of tests/test_distributed.py: a sweep, an evaluation and a scoring pass on a tiny model.

    torchrun --standalone --nproc_per_node=2 tests/distributed_worker.py CONFIG.json

CONFIG: ``out`` (the sweep's unit folder), ``result`` (where rank 0 writes what it got), ``n`` (items),
``fractions``, ``scores``; optional ``stop_rank``/``stop_after`` (that rank dies before its unit number
``stop_after + 1``, as a killed process would), ``report_out`` (a report into that folder) and ``disagree_out`` (afterwards, a sweep into that folder where
each rank uses its own seed: every rank must refuse it).
"""

import json
import os
import sys

import torch

from conftest import text_model


def tiny_text_model():
    return text_model(n_layers=3)


def sweep_settings(config: dict) -> dict:
    return dict(scores=config["scores"], fractions=config["fractions"], static_scores=config["scores"][:1], seed=3,
                batch_size=4, progress=False)


def main(path: str) -> None:
    import lens_heads.sweep.run as sweep_module
    from lens_heads.ablation.random_draws import random_zeroing
    from lens_heads.data.tasks import load_task
    from lens_heads.evaluation.evaluate import evaluate
    from lens_heads.heads.scoring import score_heads
    from lens_heads.plumbing import distributed

    config = json.loads(open(path).read())
    torch.set_num_threads(1)
    model, task = tiny_text_model(), load_task("arc_easy", split="validation", n=config["n"], seed=1)
    rank = distributed.rank()
    settings = sweep_settings(config)
    if config.get("stop_rank") == rank:
        calls = []

        def stop_after(*args, **kwargs):
            if len(calls) == config["stop_after"]:
                os._exit(3)  # no cleanup, no exception: a killed rank
            calls.append(1)
            return evaluate(*args, **kwargs)

        sweep_module.evaluate = stop_after
    result = sweep_module.run_sweep(model, task, out_dir=config["out"], **settings)
    zeroing = random_zeroing(model, 0.3, seed=1)
    evaluated = evaluate(model, task, hooks=zeroing, batch_size=3, progress=False)
    scores = score_heads(model, task, batch_size=2, progress=False)
    if distributed.is_main():
        with open(config["result"], "w") as f:
            json.dump(dict(table=result.to_dataframe().to_dict(orient="list"),
                           units=[u.to_dict() for u in result.units], meta=result.meta,
                           evaluation=evaluated.to_dict(), scores=scores.values.tolist(),
                           scores_meta=scores.meta["data"], world=distributed.world_size()), f)
    if config.get("report_out"):
        from lens_heads.report.config import ReportConfig
        from lens_heads.report.pipeline import build_report

        report = ReportConfig(model="tiny", out=config["report_out"], n=config["n"], rank_n=2, fractions=(0, 0.25),
                              scores=("AWFT",), png=False, progress=False)
        results = build_report(report, model=model, log=lambda msg: None)
        with open(f"{config['result']}.report.rank{rank}", "w") as f:
            json.dump({k: v["status"] for k, v in results["stages"].items()}, f)
    if config.get("disagree_out"):
        try:
            sweep_module.run_sweep(model, task, out_dir=config["disagree_out"], **{**settings, "seed": rank})
        except ValueError as e:
            with open(f"{config['result']}.rank{rank}.error", "w") as f:
                f.write(str(e))
    distributed.barrier()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
