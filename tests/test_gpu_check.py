"""benchmarks/gpu_check.py on the CPU (``--device cpu --smoke``): the table, the JSON, the agreements it checks, the
FLOP count it reports, and its refusals of bad input. No timing is asserted."""

import json
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lens_heads.data.rows import Row
from lens_heads.evaluation.evaluate import evaluate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their neighbours (flops, timing) by name

import gpu_check  # noqa: E402
import gpu_measure  # noqa: E402
import gpu_rows  # noqa: E402
import gpu_shapes  # noqa: E402
import gpu_train  # noqa: E402
from conftest import load_script  # noqa: E402
from flops import PAPER_MODELS_B, forward_flops, path_flops, trunk_flops_per_token, whole_logits_flops  # noqa: E402


def paper_flops_of(params_b: float, tokens: float) -> float:
    """One paper model's FLOPs by hand: 2 FLOPs a parameter a token, 14,042 questions, 12 x 6 + 6 + 1 evaluations."""
    return 2 * params_b * 1e9 * tokens * 14_042 * 79


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of the whole check (one timing round), its printed table and its folder."""
    out = tmp_path_factory.mktemp("gpu_check")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        printed = StringIO()
        with redirect_stdout(printed):
            result = gpu_check.main([str(out), "--device", "cpu", "--smoke", "--repeats", "1"])
    finally:
        torch.set_num_threads(threads)
    return result, printed.getvalue(), out


@pytest.mark.slow  # these use the smoke run of the whole check; the tests without it are fast
def test_smoke_table_shows_each_shapes_numbers(smoke):
    """Every row and shape is printed, and the printed cells carry the numbers recomputed here from the inputs and
    the measured rates (not only the labels)."""
    result, printed, _ = smoke
    lines = printed.splitlines()

    def row(label: str) -> str:
        return next(line for line in lines if line.startswith(label + " "))

    for name in gpu_shapes.SHAPES:
        assert f"{name} (smoke)" in printed
    assert [r.shape for r in result.shapes] == list(gpu_shapes.SHAPES)
    tokens = sum(n for n, _, _ in gpu_rows.check_lengths(8, True, 0))  # the smoke run's rows, as the check builds
    for r in result.shapes:
        assert f"8 / {tokens}" in row("rows / tokens")
        assert f"{r.evaluator_tokens_per_s / r.hf_sdpa_tokens_per_s:.2f}x" in row("evaluator / HF SDPA")
        # the subjects' shared prefixes run once: fewer tokens through the model than the rows hold
        assert 0 < r.forward_tokens_share < 1 and f"{r.forward_tokens_share:.0%}" in row(
            "evaluator forward tokens / row tokens")
        assert f"{r.threshold_unit_share_zeroed:.1%}" in row("threshold unit: heads zeroed")
        assert f"{r.scoring_flops_per_s / result.matmul_flops_per_s:.1%}" in row("scoring pass FLOP/s / matmul")
    for i, n in enumerate(gpu_measure.LONG_PROMPTS):  # the scoring pass on long prompts, a sixteenth as long
        cells = row(f"scoring / evaluator, {n:,}-token prompts")
        for r in result.shapes:
            long = r.long_prompts[i]
            assert long["tokens"] == n // 16 and long["prompts"] * long["tokens"] == gpu_measure.LONG_TOKENS // 16
            assert f"{long['scoring_tokens_per_s'] / long['evaluator_tokens_per_s']:.2f}x" in cells
    # the stacked sweep: the same threshold units one at a time and stacked give the same records
    st = result.stacked_sweep
    assert st["measured"] and st["units"] == 1 + len(gpu_check.STACKED_SCORES) * (len(gpu_check.STACKED_FRACTIONS) - 1)
    assert st["predictions_equal"] == st["predictions"] > 0 and st["shares_equal"]
    assert f"stacked sweep (smollm2-135m, {st['units']} units, 4 per forward)" in printed
    assert all(f"{k} {v}" in printed for k, v in gpu_check.TARGETS.items())
    # each paper model at the rate of the shape nearest its size: the smoke shapes are all toy-sized, so their
    # nominal sizes (what the record names) decide, and every model of 3B or more takes the 7B shape's rate
    mean = float(np.mean(gpu_rows.mmlu_lengths()))
    rate = {r.shape: r.evaluator_flops_per_s for r in result.shapes}
    assert [r["shape"] for r in result.projection] == [
        "qwen2.5-0.5b" if n < 0.75 else "llama-3.2-1b" if n < 2 else "qwen2.5-7b" for n in PAPER_MODELS_B]
    hours = sum(paper_flops_of(n, mean) / rate[r["shape"]] / 3600 for n, r in zip(PAPER_MODELS_B, result.projection))
    assert f"{hours:,.0f} GPU-hours" in printed and "torchrun --nproc_per_node=1 sweep" in printed


@pytest.mark.slow
def test_smoke_json_is_written_whole_and_matches_the_result(smoke):
    result, printed, out = smoke
    assert [p.name for p in out.iterdir()] == [gpu_check.RESULT]  # no temporary file left beside it
    written = json.loads((out / gpu_check.RESULT).read_text())
    assert written["table"] == printed.splitlines()[:len(written["table"])]
    assert [s["shape"] for s in written["shapes"]] == list(gpu_shapes.SHAPES)
    assert written["shapes"][0]["evaluator_tokens_per_s"] == pytest.approx(result.shapes[0].evaluator_tokens_per_s)
    assert written["device"] == "cpu" and written["dtype"] == "float32" and written["smoke"] is True
    assert written["targets"] == gpu_check.TARGETS and written["stacked_sweep"]["measured"] is True
    assert [len(s["long_prompts"]) for s in written["shapes"]] == [len(gpu_measure.LONG_PROMPTS)] * len(result.shapes)


@pytest.mark.slow
def test_smoke_trains_each_gpt2_shape_through_both_loops(smoke):
    """The training rows: every shape trained (toy size) by lens_heads' loop and the plain loop, its rates finite and
    positive, its shares in (0, 1] and equal to the rates over the matmul rate and the vendor peak, its FLOPs a step
    counted here by hand, and its cells in the printed table and the JSON."""
    result, printed, out = smoke
    assert [r.shape for r in result.training] == list(gpu_train.TRAIN_SHAPES)
    # the toy shape (2 layers, d 64, 4 heads of 16, d_mlp 256, vocab 512, windows of 32): per token a forward is
    # 2*2*(4*64*64 + 2*64*256) trunk + 2*2*4*16*33 attention + 2*64*512 logits; training 3x; 2 x 2 windows a step
    per_token = 3 * (2 * 2 * (4 * 64 * 64 + 2 * 64 * 256) + 2 * 2 * 4 * 16 * 33 + 2 * 64 * 512)
    lines = printed.splitlines()
    for r in result.training:
        assert r.error is None and (r.warmup_steps, r.timed_steps) == (1, 2) and not r.amp
        assert r.tokens_per_step == 2 * 2 * 32 and r.flops_per_step == per_token * 128 == 103_907_328
        rates = [r.loop_tokens_per_s, r.loop_flops_per_s, r.plain_tokens_per_s, r.plain_flops_per_s]
        assert all(np.isfinite(x) and x > 0 for x in rates)
        # FLOP/s = tokens/s x FLOPs a token (float64 rounding only)
        assert r.loop_flops_per_s == pytest.approx(r.loop_tokens_per_s * per_token, rel=1e-9)
        shares = [r.loop_share_of_matmul, r.loop_share_of_peak, r.plain_share_of_matmul, r.plain_share_of_peak]
        assert all(0 < x <= 1 for x in shares)
        assert r.loop_share_of_matmul == pytest.approx(r.loop_flops_per_s / result.matmul_flops_per_s, rel=1e-12)
        assert r.plain_share_of_peak == pytest.approx(r.plain_flops_per_s / 989e12, rel=1e-12)
    cells = next(line for line in lines if line.startswith("lens_heads loop / plain "))
    assert all(f"{r.loop_vs_plain:.2f}x" in cells for r in result.training)
    assert all(f"{name} (smoke)" in printed for name in gpu_train.TRAIN_SHAPES)
    written = json.loads((out / gpu_check.RESULT).read_text())["training"]
    assert [w["shape"] for w in written] == list(gpu_train.TRAIN_SHAPES)
    assert written[0]["loop_tokens_per_s"] == pytest.approx(result.training[0].loop_tokens_per_s)
    assert written[0]["device_name"] == "cpu" and written[0]["loop_share_of_peak"] > 0


def test_training_shapes_are_the_inheritune_presets():
    """The check trains what the presets train: the reference's shape, the micro-batch and accumulation."""
    script = load_script("inheritune")
    for name, shape in gpu_train.TRAIN_SHAPES.items():
        a = script.parse_args(["--preset", name, "--plan"])
        assert (shape.n_layers, shape.d_model, shape.n_heads, shape.seq_len) == (a.ref_layers, a.d_model, a.heads,
                                                                                  a.seq_len)
        assert (shape.micro_batch, shape.grad_accum, shape.vocab) == (a.batch_size, a.grad_accum, a.vocab) and a.amp


@pytest.mark.slow
def test_smoke_rows_auto_size_and_threshold_unit(smoke):
    result, _, _ = smoke
    rows = gpu_rows.check_lengths(8, True, 0)
    lengths = [n for n, _, _ in rows]
    recorded = gpu_rows.mmlu_lengths()
    assert set(lengths) <= {max(8, r // 16) for r in recorded}  # toy rows: a sixteenth of recorded MMLU rows
    for shape in result.shapes:
        assert shape.rows == 8 and shape.tokens == sum(lengths)
        # 8 MMLU rows read 32 continuations; on a CPU nothing runs out of memory, so auto keeps its first size, 16
        assert shape.auto_batch_size == 16 and shape.auto_peak_memory_gib is None
        assert 0.0 < shape.threshold_unit_share_zeroed < 0.5


@pytest.mark.slow
def test_evaluator_log_likelihoods_equal_hugging_face_on_the_same_weights(smoke):
    result, _, _ = smoke
    for shape in result.shapes:  # toy models' one-token log-likelihoods (~ln 512): float32 rounding ~1e-6
        assert shape.max_logprob_difference < 1e-4


def test_other_weights_would_show_in_the_log_likelihood_difference():
    # The agreement above can fail: a HF model of the same shape with other weights is far off.
    shape = gpu_shapes.SHAPES["qwen2.5-0.5b"].smoke()
    _, model = gpu_shapes.build_pair("qwen2.5-0.5b", shape, "cpu", torch.float32, seed=0)
    other, _ = gpu_shapes.build_pair("qwen2.5-0.5b", shape, "cpu", torch.float32, seed=1)
    task = gpu_rows.synthetic_task(gpu_rows.check_lengths(4, True, 0), shape.vocab, 0)
    ours = gpu_measure.logprobs_of(evaluate(model, task, batch_size=4, progress=False))
    assert gpu_measure.max_difference(ours, gpu_measure.hf_logprobs(other, model, task, 4)) > 1e-3


@pytest.mark.slow
def test_torchrun_sweep_equals_the_plain_run(smoke):
    if not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed (torchrun)")
    torchrun = smoke[0].torchrun
    assert torchrun.error is None, torchrun.error
    assert torchrun.units == 3 and torchrun.same_shares and torchrun.max_logprob_difference == 0.0
    assert torchrun.equal


def test_flop_count_of_a_tiny_config_by_hand():
    cfg = SimpleNamespace(n_layers=2, d_model=4, n_heads=2, n_key_value_heads=1, d_head=2, d_mlp=8, gated_mlp=True,
                          d_vocab=10)
    # per layer: Q and O 4*2*2 each, K and V 4*1*2 each, gated MLP 3*4*8; 2 FLOPs a multiply-add; 2 layers
    per_token = 2 * 2 * (4 * 2 * 2 * 2 + 2 * 4 * 1 * 2 + 3 * 4 * 8)
    assert trunk_flops_per_token(cfg) == per_token == 576
    # 3 tokens; causal QK^T and AV: 2 layers * 2 * 2 heads * 2 d_head * 3 * 4; logits at 2 positions: 2 * 4 * 10 * 2
    assert forward_flops(cfg, [3], 2) == 3 * 576 + 2 * 2 * 2 * 2 * 3 * 4 + 2 * 4 * 10 * 2



def test_a_shared_prefix_is_counted_once_and_logits_at_every_token_read():
    cfg = SimpleNamespace(n_layers=2, d_model=4, n_heads=2, n_key_value_heads=1, d_head=2, d_mlp=8, gated_mlp=True,
                          d_vocab=10)
    model = SimpleNamespace(cfg=cfg)
    # two rows of 10 tokens sharing their first 8, each reading 2 positions (the first at 8: the prefix ends there)
    rows = [Row(0, list(range(10)), [(0, 8, [5, 6])]), Row(0, list(range(8)) + [20, 21], [(1, 8, [7, 7])])]
    whole = path_flops(model, rows)
    assert whole == forward_flops(cfg, [10, 10], 4)
    # the shared path runs the 8 prefix tokens (and their attention among themselves) once instead of twice
    assert whole - path_flops(model, rows, batch_size=2) == forward_flops(cfg, [8], 0)
    assert whole_logits_flops(model, rows) == forward_flops(cfg, [10, 10], 20)
    # letters read at one position: the evaluator computes that position's logits once per letter, and so counts it
    letters = [Row(0, list(range(6)), [(c, 5, [30 + c]) for c in range(4)])]
    assert path_flops(model, letters) == forward_flops(cfg, [6], 4)


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_cuda_without_a_gpu_is_refused_with_what_to_do(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = refused([str(tmp_path), "--device", "cuda"], capsys)
    assert "CUDA is not available" in err and "--device cpu --smoke" in err
    assert not list(tmp_path.iterdir())


def test_bf16_on_the_cpu_is_refused(capsys, tmp_path):
    err = refused([str(tmp_path), "--device", "cpu", "--smoke", "--dtype", "bfloat16"], capsys)
    assert "--dtype bfloat16 on the CPU" in err and "--dtype float32" in err


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Old GPU")
    err = refused([str(tmp_path), "--device", "cuda"], capsys)
    assert "--dtype bfloat16: this GPU (Old GPU) does not support bfloat16" in err


def test_unknown_shape_and_missing_folder_are_refused(capsys, tmp_path):
    err = refused([str(tmp_path), "--device", "cpu", "--smoke", "--shapes", "smollm2-135m,gpt-5"], capsys)
    assert "unknown shape gpt-5: choose from smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, qwen2.5-7b" in err
    assert "give the folder" in refused(["--device", "cpu", "--smoke"], capsys)
    err = refused([str(tmp_path), "--device", "cpu", "--smoke", "--train-shapes", "gpt2-xl,gpt2-large"], capsys)
    assert "unknown training shape gpt2-large: choose from gpt2-medium, gpt2-xl (or '' for none)" in err


def test_rows_of_one_subject_share_the_recorded_prefix_and_no_more():
    """The synthetic rows of a subject begin alike for as many ids as the recorded real rows do, then differ: the
    evaluator's shared prefixes see on them what they see on real MMLU."""
    rows = [(40, 25, "algebra"), (52, 25, "algebra"), (30, 0, "law"), (33, 12, "anatomy"), (36, 12, "anatomy")]
    task = gpu_rows.synthetic_task(rows, 512, seed=0)
    ids = [[int(t) for t in item.contexts[0].split()] for item in task]
    assert [len(x) for x in ids] == [n for n, _, _ in rows] and all(len(set(item.contexts)) == 1 for item in task)
    assert ids[0][:25] == ids[1][:25] and ids[0][25] != ids[1][25]  # random ids of 507: equal by chance 1 in 507
    assert ids[3][:12] == ids[4][:12] and ids[3][12] != ids[4][12] and ids[2][0] not in (ids[0][0], ids[3][0])
    recorded = gpu_rows.mmlu_rows()  # the record: each row's shared prefix shorter than the row, by subject
    assert all(0 <= shared < n for n, shared, _ in recorded) and len({s for _, _, s in recorded}) > 1
