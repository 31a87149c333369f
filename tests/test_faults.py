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
    from lens_heads.sweep.run import run_sweep
    from signal_worker import SETTINGS

    torch.set_num_threads(1)
    task = load_task("arc_easy", split="validation", n=N_ITEMS, seed=1)
    return run_sweep(text_model(n_layers=3), task, out_dir=out_dir, **SETTINGS)


def unit_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*__*__*.json"))  # kind__score__fraction: units, not the calibration


@pytest.mark.slow  # real subprocesses, each loading torch and a model (seconds each)
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


@pytest.mark.slow  # the report end to end on the tiny model, twice
def test_sigterm_stops_the_report_and_the_same_command_resumes_to_the_same_results(tmp_path, monkeypatch, capsys):
    """SIGTERM in the ablation sweep: exit 143 naming the folder; the rerun reuses the finished stages and units and
    writes the numbers a clean run writes."""
    import lens_heads.sweep.run as sweep_run
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


def test_a_full_then_read_only_output_folder_fails_clearly_leaves_nothing_partial_and_resumes(tmp_path, monkeypatch):
    """A sweep into a 32 KiB tmpfs (mounted here where the test may; else the writer fails the same way): the
    folder fills mid-run, the error names it, the bytes needed and what to do; no partial file; read-only next;
    with room again the same call resumes from the kept units to the numbers of an uninterrupted run."""
    import errno

    from lens_heads.plumbing import io

    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0

    def fail_writes(code: int, after: int):  # where no file system can be mounted: the writer fails instead
        calls = []

        def fsync(fd):
            if len(calls) >= after:
                raise OSError(code, os.strerror(code))
            calls.append(1)

        monkeypatch.setattr(io.os, "fsync", fsync)

    try:
        if not mounted:
            fail_writes(errno.ENOSPC, after=4)
        units = folder / "units"
        with pytest.raises(io.OutputFolderError, match=rf"in {units}: no space left on the device \(\d[\d,]* bytes "
                                                       r"free there\).*run the same command again"):
            clean_sweep(units)
        kept = unit_files(units)
        assert 1 <= len(kept) < 7 and not list(units.glob(".*.tmp"))
        for path in units.glob("*.json"):  # every file whole
            json.loads(path.read_text())
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        else:
            fail_writes(errno.EROFS, after=0)
        with pytest.raises(io.OutputFolderError, match="the file system is read-only"):
            clean_sweep(units)
        if mounted:
            subprocess.run(["mount", "-o", "remount,rw,size=4m", str(folder)], check=True)
        else:
            monkeypatch.undo()
        resumed = clean_sweep(units)
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
    reference = clean_sweep()
    assert resumed.meta["units_reused"] == len(kept)
    for unit, ref in zip(resumed.units, reference.units, strict=True):
        assert unit.key == ref.key and [it.logprobs for it in unit.result.items] == [it.logprobs for it in
                                                                                      ref.result.items]


@pytest.mark.slow  # real subprocesses, each loading torch and a model (seconds each)
def test_job_array_workers_on_one_folder_with_one_killed_by_kill_9_lose_nothing_and_compute_nothing_twice(tmp_path):
    """Two job array tasks on one folder at once; task 0 is killed with SIGKILL in the middle of its second unit.
    Task 1 finishes its own units; no unit is stored by both; no file is torn; task 0 run again completes the rest,
    each unit stored once in all, and every unit equals the one-process run's."""
    out = tmp_path / "units"
    workers = {}
    for task in (0, 1):
        config = dict(out=str(out), result=str(tmp_path / f"task{task}.json"), n=N_ITEMS)
        env = dict(SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_COUNT="2", SLURM_ARRAY_TASK_MIN="0")
        workers[task] = start_worker("signal_worker.py", dict(config, pause_after=1) if task == 0 else config,
                                     tmp_path, f"task{task}", env)
    wait_for(tmp_path / "task0.json.ready", workers[0])
    workers[0].kill()  # SIGKILL: no handler runs, nothing is cleaned up
    workers[0].communicate(timeout=60)
    assert workers[0].returncode == -signal.SIGKILL
    _, err = workers[1].communicate(timeout=600)
    assert workers[1].returncode == 0, err[-3000:]
    assert json.loads((tmp_path / "task1.json").read_text()) is None  # task 0's share is missing: no result yet
    logs = {task: (tmp_path / f"task{task}.json.log").read_text().splitlines() for task in (0, 1)}
    assert len(logs[0]) == 1 and not set(logs[0]) & set(logs[1])
    for path in out.glob("*.json"):  # every file whole; the killed unit left only, at most, a temporary file
        json.loads(path.read_text())
    rerun = start_worker("signal_worker.py", dict(out=str(out), result=str(tmp_path / "task0.json"), n=N_ITEMS),
                         tmp_path, "task0-again", dict(SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="2",
                                                       SLURM_ARRAY_TASK_MIN="0"))
    _, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-3000:]
    stored = (tmp_path / "task0.json.log").read_text().splitlines() + logs[1]
    got = json.loads((tmp_path / "task0.json").read_text())
    assert len(stored) == len(set(stored)) == len(got["units"])  # each unit stored once, by one task
    reference = clean_sweep()
    for unit, ref in zip(got["units"], reference.units, strict=True):
        assert unit["key"] == ref.key
        assert [it["logprobs"] for it in unit["result"]["items"]] == [it.logprobs for it in ref.result.items]


@pytest.mark.floats
def test_out_of_memory_mid_sweep_with_auto_batch_size_halves_and_goes_on_recording_the_size(monkeypatch):
    """From the sweep's third unit on, a forward of more than 4 rows runs out of memory (as a GPU would): that unit
    halves its batch until it fits, the units after it start at that size, and the sweep finishes, every unit
    recording its batch size, with
    the log-likelihoods of a sweep run at that size (other batches: float rounding, conftest's LOGLIK_TOL)."""
    import numpy as np
    import torch

    import lens_heads.evaluation.evaluate as evaluate_module
    from conftest import LOGLIK_TOL
    from signal_worker import SETTINGS

    run_passes, calls = evaluate_module.run_passes, []

    def tight_memory(model, work, run, *args):
        batch_size = run.settings.batch_size
        calls.append(batch_size)
        if len(calls) > 2 and batch_size > 4:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate a batch of {batch_size} rows")
        return run_passes(model, work, run, *args)

    monkeypatch.setattr(evaluate_module, "run_passes", tight_memory)
    monkeypatch.setitem(SETTINGS, "batch_size", "auto")
    swept = clean_sweep()
    monkeypatch.undo()
    assert swept is not None and any(size > 4 for size in calls[:2]) and calls[-1] == 4
    settled_at = calls.index(4)  # the third unit halved down to 4; the units after it start there
    assert set(calls[settled_at:]) == {4}
    settled = [unit.result.meta["batch_size"] for unit in swept.units]
    assert settled[0] > 4 and set(settled[2:]) == {4}
    at_four = clean_sweep()  # SETTINGS' batch_size of 4
    for unit, ref in zip(swept.units, at_four.units, strict=True):
        np.testing.assert_allclose([it.logprobs for it in unit.result.items],
                                   [it.logprobs for it in ref.result.items], **LOGLIK_TOL)


def test_a_folder_asking_for_remote_code_is_refused_unless_the_user_opts_in(tmp_path):
    """auto_map in config.json (or tokenizer_config.json) is refused with the reason and the opt-in; opted in, the
    folder loads as Transformers' own Llama, its code unrun: the same logits as the folder without auto_map."""
    import torch

    import lens_heads as lh
    from families import INPUTS, build_folder
    from lens_heads.plumbing.errors import InputError

    plain = build_folder("llama-3", tmp_path / "plain")
    asking = build_folder("llama-3", tmp_path / "asking")
    (asking / "evil.py").write_text("raise SystemExit('the code of the folder ran')\n")
    config = json.loads((asking / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.Config", "AutoModelForCausalLM": "evil.Model"}
    (asking / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"asks for remote code \(config.json: auto_map \['AutoConfig', "
                                         r"'AutoModelForCausalLM'\]\).*never runs it.*ignore_remote_code=True"):
        lh.load_model(str(asking), device="cpu")
    model = lh.load_model(str(asking), device="cpu", ignore_remote_code=True)
    reference = lh.load_model(str(plain), device="cpu")
    tokens = torch.tensor([INPUTS[0]])
    assert torch.equal(model(tokens), reference(tokens))

    tokenizer_config = json.loads((plain / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": ["evil.Tokenizer", None]}
    (plain / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    with pytest.raises(InputError, match=r"tokenizer_config.json: auto_map \['AutoTokenizer'\]"):
        lh.load_model(str(plain), device="cpu")
    config["model_type"] = "evil_model"
    (asking / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="'evil_model' is not one Transformers implements"):
        lh.load_model(str(asking), device="cpu")


def test_a_deferring_loop_stops_at_its_safe_point_and_a_second_signal_stops_at_once(capsys):
    """What a training loop uses: SIGTERM during a step lets the step (and its checkpoint) finish, then stops at
    the loop's safe point with 143; a second signal before it does not wait."""
    from lens_heads.plumbing import signals

    steps = []
    with pytest.raises(SystemExit) as stopped:
        with signals.stoppable("training", "in ckpt", defer=True):
            for step in range(5):
                if step == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
                steps.append(step)  # the rest of the step runs
                signals.safe_point()
    assert steps == [0, 1] and stopped.value.code == 143
    assert "training stopped by SIGTERM (exit 143): every finished unit is kept in ckpt" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        with signals.stoppable("training", "in ckpt", defer=True):
            os.kill(os.getpid(), signal.SIGTERM)
            steps.append("held")
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("not reached")
    assert steps[-1] == "held" and stopped.value.code == 130
    signals.safe_point()  # outside a block: nothing pending, nothing raised
