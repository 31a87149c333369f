"""Sharding with torch.distributed (torchrun ranks on gloo) and job arrays: the same numbers as one process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import lens_heads.sweep.run as sweep_module
from conftest import LOGLIK_TOL
from distributed_worker import sweep_settings, tiny_text_model
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.heads.scoring import score_heads
from lens_heads.plumbing import distributed
from lens_heads.sweep.run import run_sweep

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"
CONFIG = dict(n=5, fractions=[0, 0.25, 0.5], scores=["AHON (LN)", "AWFT"])


def torchrun(n_procs: int, config: dict, tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={n_procs}", str(WORKER), str(path)],
                          env=env, capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def single_process():
    """The reference: the same model, task and settings in this one process (one thread, as the ranks)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, task = tiny_text_model(), load_task("arc_easy", split="validation", n=CONFIG["n"], seed=1)
        sweep = run_sweep(model, task, **sweep_settings(CONFIG))
        evaluated = evaluate(model, task, hooks=random_zeroing(model, 0.3, seed=1), batch_size=3, progress=False)
        scores = score_heads(model, task, batch_size=2, progress=False)
    finally:
        torch.set_num_threads(threads)
    return model, task, sweep, evaluated, scores


def test_blocks_cover_every_index_once_in_order():
    for n in range(0, 12):
        for count in range(1, 6):
            blocks = [distributed.block(n, i, count) for i in range(count)]
            assert [i for b in blocks for i in b] == list(range(n))
            assert max(len(b) for b in blocks) - min(len(b) for b in blocks) <= 1


def test_without_torchrun_the_world_is_one_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"):
        monkeypatch.delenv(name, raising=False)
    assert not distributed.launched() and not distributed.sharding() and distributed.is_main()
    assert distributed.unit_workers() == distributed.Workers(0, 1, "single")
    assert distributed.all_gather({"a": 1}) == [{"a": 1}] and not torch.distributed.is_initialized()
    assert distributed.device() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_job_array_index_and_count_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "4")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    assert distributed.unit_workers() == distributed.Workers(1, 3, "array")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "9")
    with pytest.raises(ValueError, match="outside the 3 array tasks"):
        distributed.unit_workers()
    monkeypatch.delenv("SLURM_ARRAY_TASK_COUNT")
    with pytest.raises(ValueError, match="SLURM_ARRAY_TASK_COUNT"):
        distributed.unit_workers()


def test_job_array_tasks_share_the_units_and_a_plain_run_merges(single_process, tmp_path, monkeypatch):
    model, task, reference, _, _ = single_process
    calls = []
    unit_result = sweep_module.unit_result  # called once per unit evaluated, alone or stacked
    monkeypatch.setattr(sweep_module, "unit_result", lambda *a, **k: (calls.append(1), unit_result(*a, **k))[1])
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    n_units = len(reference.units)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert run_sweep(model, task, out_dir=tmp_path, **sweep_settings(CONFIG)) is None  # task 1 hasn't run
    assert len(calls) == n_units // 2
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    last = run_sweep(model, task, out_dir=tmp_path, **sweep_settings(CONFIG))  # finds task 0's units too
    assert len(calls) == n_units and last.meta["workers"] == dict(index=1, count=2, kind="array")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    monkeypatch.delenv("SLURM_ARRAY_TASK_COUNT")
    merged = run_sweep(model, task, out_dir=tmp_path, **sweep_settings(CONFIG))
    assert len(calls) == n_units and merged.meta["units_run"] == 0
    pd.testing.assert_frame_equal(merged.to_dataframe(), reference.to_dataframe())


@pytest.mark.torchrun
def test_two_torchrun_ranks_on_gloo_give_the_single_process_numbers_and_a_killed_rank_resumes(single_process,
                                                                                               tmp_path):
    _, _, reference, evaluated, scores = single_process
    out, result = tmp_path / "units", tmp_path / "result.json"
    config = dict(CONFIG, out=str(out), result=str(result))
    killed = torchrun(2, dict(config, stop_rank=1, stop_after=1), tmp_path, "killed")
    assert killed.returncode != 0 and not result.exists()
    left = len(list(out.glob("*__*__*.json")))
    assert 1 <= left < len(reference.units)  # rank 1 wrote its first unit, then died

    resumed = torchrun(2, config, tmp_path, "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = json.loads(result.read_text())
    assert got["world"] == 2 and got["meta"]["units_run"] == len(reference.units) - left
    table = pd.DataFrame(got["table"])
    pd.testing.assert_frame_equal(table, reference.to_dataframe(), check_dtype=False)
    for unit, ref in zip(got["units"], reference.units):  # item by item, exactly
        assert unit["key"] == ref.key
        assert [it["logprobs"] for it in unit["result"]["items"]] == [it.logprobs for it in ref.result.items]

    # evaluate and score_heads: each rank ran a block of the items (batches differ, so equal to float rounding);
    # the random zeroing drew by the task's item numbers, as in one process
    items = got["evaluation"]["items"]
    assert [it["id"] for it in items] == [it.id for it in evaluated.items]
    np.testing.assert_allclose([it["logprobs"] for it in items], [it.logprobs for it in evaluated.items],
                               **LOGLIK_TOL)
    assert got["evaluation"]["meta"]["ranks"] == 2 and got["evaluation"]["meta"]["task"]["n"] == CONFIG["n"]
    # scores of rows in other batches: as test_scores.py's streaming pass against its reference
    np.testing.assert_allclose(np.array(got["scores"]), scores.values.numpy(), atol=1e-5, rtol=1e-4)
    assert got["scores_meta"]["n"] == CONFIG["n"] and got["scores_meta"]["n_tokens"] == scores.meta["data"]["n_tokens"]
    assert got["scores_meta"]["row_items"] == scores.meta["data"]["row_items"]  # rows mapped to the task's items


@pytest.mark.torchrun
def test_ranks_without_work_finish_and_disagreeing_ranks_write_nothing(tmp_path):
    out, result, bad = tmp_path / "units", tmp_path / "result.json", tmp_path / "disagree"
    config = dict(n=2, fractions=[0], scores=["AWFT"], out=str(out), result=str(result), disagree_out=str(bad),
                  report_out=str(tmp_path / "report"))
    run = torchrun(3, config, tmp_path, "three")  # one unit (the baseline) and two items for three ranks
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(result.read_text())
    assert got["world"] == 3 and [u["spec"]["kind"] for u in got["units"]] == ["baseline"]
    n_rows = len(got["scores"])  # the evaluated rows of the two items (one per choice)
    assert len(got["evaluation"]["items"]) == 2 and got["scores_meta"]["row_items"] == [0] * (n_rows // 2) + [1] * (
        n_rows // 2)
    for rank in range(3):
        message = Path(f"{result}.rank{rank}.error").read_text()
        assert "ranks disagree on the sweep fingerprint" in message and "seed" in message
    assert not bad.exists() or not any(bad.iterdir())
    for rank in range(3):  # the report: every stage ran on every rank; rank 0 wrote it
        stages = json.loads(Path(f"{result}.report.rank{rank}").read_text())
        assert set(stages.values()) == {"done"}, stages
    written = json.loads((tmp_path / "report" / "results.json").read_text())
    assert written["scores"]["arc_easy"]["data"]["n"] == 2 and (tmp_path / "report" / "report.html").exists()
