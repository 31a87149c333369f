"""Faults a long run survives, each tried for real: SIGTERM and SIGINT in the middle of a sweep (subprocesses), job
array workers on one folder with one killed by kill -9, a full or read-only output folder, out-of-memory with
``batch_size="auto"`` and a model folder that asks for remote code."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest  # noqa: I001

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS = 4


def start_worker(script: str, config: dict, tmp_path: Path, name: str, env: dict | None = None) -> subprocess.Popen:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / script), str(path)], cwd=ROOT, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the worker ended ({process.returncode}) first: {process.stderr.read()[-3000:]}")
        if time.monotonic() > end:
            process.kill()
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.1)


def clean_sweep(out_dir=None):
    """The worker's sweep in this process, uninterrupted."""
    import torch

    from conftest import text_model
    from lens_heads.data.tasks import load_task
    from lens_heads.experiments.sweep_run import run_sweep
    from signal_worker import SETTINGS

    torch.set_num_threads(1)
    task = load_task("arc_easy", split="validation", n=N_ITEMS, seed=1)
    return run_sweep(text_model(n_layers=3), task, out_dir=out_dir, **SETTINGS)


def unit_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*__*__*.json"))  # kind__score__fraction: units, not the calibration


def test_sigterm_and_sigint_stop_a_sweep_keeping_its_units_and_a_rerun_equals_a_clean_run(tmp_path):
    """SIGTERM in the middle of a unit (the worker waits inside its third evaluation): exit 143, every finished
    unit kept, no partial file, one line saying how to resume; SIGINT later in the rerun: 130; the next rerun
    finishes, every unit equal to a clean run's."""
    out, result = tmp_path / "units", tmp_path / "result.json"
    config = dict(out=str(out), result=str(result), n=N_ITEMS)
    finished = [0]
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        ready = Path(f"{result}.ready")
        ready.unlink(missing_ok=True)
        worker = start_worker("signal_worker.py", dict(config, pause_after=2), tmp_path, f"stop{code}")
        wait_for(ready, worker)
        kept = len(unit_files(out))
        assert kept > finished[-1]  # this run finished units of its own before the signal
        finished.append(kept)
        worker.send_signal(sig)
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == code, err[-3000:]
        name = signal.Signals(sig).name
        assert f"sweep stopped by {name} (exit {code})" in err and f"kept in {out}" in err and "again to resume" in err
        assert "Traceback" not in err
        assert len(unit_files(out)) == kept and not list(out.glob(".*.tmp"))  # finished units only, none torn
    resumed = start_worker("signal_worker.py", config, tmp_path, "resumed")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    got = json.loads(result.read_text())
    reference = clean_sweep()
    assert got["meta"]["units_reused"] == finished[-1] and reference.meta["units_reused"] == 0
    assert len(got["units"]) == len(reference.units)
    for unit, ref in zip(got["units"], reference.units):  # the same evaluations: item by item, exactly
        assert unit["key"] == ref.key
        assert [it["logprobs"] for it in unit["result"]["items"]] == [it.logprobs for it in ref.result.items]


def sigterm_after(calls: int, function):
    """``function``, which sends this process SIGTERM when called for the ``calls + 1``-th time (mid-run)."""
    seen = []

    def wrapped(*args, **kwargs):
        if len(seen) == calls:
            os.kill(os.getpid(), signal.SIGTERM)
        seen.append(1)
        return function(*args, **kwargs)

    return wrapped


def test_sigterm_stops_head_effects_keeping_each_finished_head_and_a_rerun_equals_a_clean_run(tmp_path, monkeypatch,
                                                                                              capsys):
    import lens_heads.experiments.effects as effects
    from conftest import text_model
    from lens_heads.data.tasks import load_task

    model, task = text_model(n_layers=2), load_task("arc_easy", split="validation", n=2, seed=1)
    clean = effects.head_effects(model, task, progress=False)
    monkeypatch.setattr(effects, "evaluate_each", sigterm_after(1, effects.evaluate_each))  # during layer 1
    with pytest.raises(SystemExit) as stopped:
        effects.head_effects(model, task, out_dir=tmp_path, progress=False)
    assert stopped.value.code == 143
    assert f"head effects stopped by SIGTERM (exit 143): every finished unit is kept in {tmp_path}" in \
        capsys.readouterr().err
    kept = sorted(p.stem for p in tmp_path.glob("L*H*.json"))
    assert kept == [f"L00H{h:02d}" for h in range(model.cfg.n_heads)] and not list(tmp_path.glob(".*.tmp"))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back
    monkeypatch.undo()
    resumed = effects.head_effects(model, task, out_dir=tmp_path, progress=False)
    assert resumed.meta["units_reused"] == 1 + model.cfg.n_heads  # the baseline and layer 0's heads
    assert resumed.values.equal(clean.values)


def test_sigterm_stops_the_report_and_the_same_command_resumes_to_the_same_results(tmp_path, monkeypatch, capsys):
    """SIGTERM in the ablation sweep: exit 143 naming the folder; the rerun reuses the finished stages and units and
    writes the numbers a clean run writes."""
    import lens_heads.experiments.sweep_run as sweep_run
    from conftest import text_model
    from lens_heads.report import pipeline
    from lens_heads.report.__main__ import main

    model = text_model(n_ctx=512)
    monkeypatch.setattr(pipeline, "load_model", lambda *args, **kwargs: model)
    args = ["tiny", "--tasks", "arc_easy", "--quick", "--n", "2", "--rank-n", "2", "--fractions", "0,0.25",
            "--scores", "AWFT", "--no-png", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "clean")]) == 0
    with monkeypatch.context() as patch:
        patch.setattr(sweep_run, "evaluate", sigterm_after(2, sweep_run.evaluate))
        with pytest.raises(SystemExit) as stopped:
            main([*args, "--out", str(tmp_path / "report")])
    assert stopped.value.code == 143
    err = capsys.readouterr().err
    assert f"report stopped by SIGTERM (exit 143): every finished unit is kept in {tmp_path / 'report'}" in err
    assert not (tmp_path / "report" / "results.json").exists()
    assert main([*args, "--out", str(tmp_path / "report")]) == 0
    got, reference = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("report", "clean"))
    ran = {k: got["ablation"]["arc_easy"]["meta"].pop(k) for k in ("units_run", "units_reused", "out_dir")}
    for k in ("units_run", "units_reused", "out_dir"):
        reference["ablation"]["arc_easy"]["meta"].pop(k)
    assert ran["units_reused"] == 2 and ran["units_run"] == 1  # the two units finished before the signal are reused
    assert got["scores"]["arc_easy"].pop("reused_from_cache") and not reference["scores"]["arc_easy"].pop(
        "reused_from_cache")  # the scores stage finished before the signal
    assert got["ablation"] == reference["ablation"] and got["scores"] == reference["scores"]
