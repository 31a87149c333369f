"""The analyses' paper-scale presets say what the specs say (they can't be run here: no GPU, no hub)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "analyses" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpt2_medium_preset_is_the_papers_run():
    """shared/specs/inheritune.md: GPT-2 medium 24 layers (d 1024, 16 heads), students from 12 layers growing by 2,
    AdamW lr 2e-4 cosine to 1e-5, warmup 2000, weight decay 0.1, betas (0.9, 0.95), clip 1.0, block 1024, about 49K
    tokens a step, 100K steps, on OpenWebText."""
    script = load_script("inheritune")
    config = script.build_config(script.parse_args(["--preset", "gpt2-medium", "--device", "cpu"]))
    assert (config.ref_layers, config.d_model, config.n_heads, config.n_ctx) == (24, 1024, 16, 1024)
    assert (config.student_layers, config.grow_by) == (12, 2)
    t = config.train
    assert (t.steps, t.lr, t.min_lr, t.warmup_steps, t.weight_decay) == (100_000, 2e-4, 1e-5, 2000, 0.1)
    assert (t.beta1, t.beta2, t.grad_clip, t.seq_len) == (0.9, 0.95, 1.0, 1024)
    assert t.tokens_per_step == pytest.approx(49_000, rel=0.01)
    assert script.parse_args(["--preset", "gpt2-medium"]).corpus == "openwebtext"


def test_rank_windows_must_fit_the_models_context():
    script = load_script("inheritune")
    args = script.parse_args([])
    assert args.rank_len <= args.seq
    with pytest.raises(SystemExit):
        script.parse_args(["--rank-len", str(args.seq + 1)])
