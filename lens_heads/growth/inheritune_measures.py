"""The measurements beside Inheritune's training runs (analyses/inheritune.py, analyses/inheritune_baselines.py): the
rank of uniform causal attention, the rank profile of the embedded SmolLM2, and the zero-shot accuracy of the trained
stages. ``a`` below is the run's settings (their ``eval_tasks``, ``eval_n``, ``seed`` and the GPT-2's sizes)."""

from __future__ import annotations

from pathlib import Path

import torch

from lens_heads.collapse.rank import approx_rank, attention_rank, mass_columns
from lens_heads.growth.gpt2 import GPT2Options
from lens_heads.growth.zero_shot import PAPER_TASKS
from lens_heads.training.windows import eval_windows


def uniform_causal_levels(length: int) -> dict:
    """Rank and m* of uniform causal averaging (each query spreads evenly over its prefix) at ``length`` tokens:
    the attention of a freshly initialised GPT-2, and of one whose attention has learned nothing yet."""
    U = torch.ones(length, length).tril()
    U = U / U.sum(-1, keepdim=True)
    return {"length": length, "rank": int(approx_rank(U)), "mass_columns": int(mass_columns(U))}


def smollm_profile(corpus, tokenizer, n: int, length: int) -> dict:
    """Rank profile of the embedded SmolLM2-135M on English validation text (per-input and batch-averaged)."""
    from lens_heads.models.loading import load_model

    model = load_model()
    # text from the held-out SOTU years, re-tokenised by SmolLM2's own tokenizer and cut to `length` tokens
    windows = eval_windows(corpus.val, n, int(length * 1.5))
    texts = [tokenizer.decode(w.tolist()).replace("<|endoftext|>", "\n") for w in windows]
    out = {}
    for average in (False, True):
        profile = attention_rank(model, texts, average=average, max_len=length, batch_size=8, progress=True)
        out["averaged" if average else "per_input"] = profile.to_dict()
    return out


def eval_tasks(a) -> dict[str, str]:
    """The ``--eval-tasks`` with the paper's metric for each (acc; acc_norm for HellaSwag)."""
    return {t: PAPER_TASKS.get(t, "sum") for t in a.eval_tasks.split(",") if t}


def zero_shot_rows(a, stage_name: str, model) -> list[dict]:
    from lens_heads.growth.zero_shot import zero_shot

    rows = [{"stage": stage_name, **r} for r in zero_shot(model, eval_tasks(a), n=a.eval_n, seed=a.seed)]
    for r in rows:
        print(f"zero-shot {r['task']} {stage_name}: " + (f"{r['accuracy']:.3f} ({r['primary']}) on n={r['n']} "
              f"({r['dropped_longer_than_context']} items longer than the context dropped; chance {r['chance']:.2f})"
              if r["available"] else "not available (" + r["note"] + ")"))
    return rows


def zero_shot(a, stages_dir: Path, result, tokenizer, options: GPT2Options) -> list[dict]:
    """Zero-shot accuracy of the reference, the final student, the scratch baselines and the ablations."""
    from lens_heads.growth.gpt2 import gpt2_config, gpt2_model
    from lens_heads.training.checkpoints import load_model_state

    rows = []
    for stage in result.stages:
        if stage.kind in ("stack_source", "width_source") or (stage.kind == "student"
                                                               and stage.n_layers != result.final_layers):
            continue
        cfg = gpt2_config(stage.n_layers, d_model=a.d_model, n_heads=a.heads, n_ctx=a.seq_len, d_vocab=a.vocab)
        model = gpt2_model(cfg, seed=0, options=options, tokenizer=tokenizer, device=a.device)
        load_model_state(model, stages_dir / stage.name / "final" / "model.safetensors")
        rows += zero_shot_rows(a, stage.name, model)
    return rows

