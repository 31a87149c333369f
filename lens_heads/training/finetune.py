"""A short supervised fine-tune of a Hugging Face causal language model on a task's solved items, in plain PyTorch.

Each training example is one item laid out as its evaluation lays it out (:mod:`lens_heads.data.rows`: the item's
context, then its gold answer), and the loss is the gold answer's mean token negative log-likelihood given the
context: the instruction/answer format of supervised fine-tuning, with the task's own prompt as the instruction.
The logits are computed only at the answer positions (most positions are prompt).

AdamW, linear warm-up then linear decay to zero, gradient clipping; the batch of step ``s`` is a pure function of
(``seed``, ``s``). The held-out loss (the same loss on other items) is measured every ``eval_every`` steps. The
fine-tuned weights are written as a Hugging Face folder (safetensors, with the tokenizer and a ``finetune.json``
holding the settings and both loss curves), which ``lens_heads.load_model(folder)`` loads like any local model.
A folder that already holds the same fine-tune (same base, data and settings) is reused; one that holds another
is refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lens_heads.data.rows import DEFAULT_PROTOCOL, item_rows
from lens_heads.plumbing.cache import canonical
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json

RECORD = "finetune.json"


@dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of the fine-tune (a short run: a few hundred examples)."""

    steps: int = 150
    batch_size: int = 8
    lr: float = 3e-5
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 25
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise InputError(f"FinetuneConfig({name}={getattr(self, name)}): give a whole number >= 1")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise InputError(f"FinetuneConfig: lr must be > 0 and warmup_steps >= 0, got {self.lr}, "
                             f"{self.warmup_steps}")


@dataclass(frozen=True)
class Example:
    """One solved item: the forward row's ``tokens``; positions ``first .. first + len(answer) - 1`` predict
    ``answer`` (the gold continuation's tokens)."""

    tokens: tuple[int, ...]
    first: int
    answer: tuple[int, ...]

    def __post_init__(self):
        if not self.answer or len(self.tokens) != self.first + len(self.answer) \
                or tuple(self.tokens[self.first + 1:]) != tuple(self.answer[:-1]):
            raise InputError(f"Example: the tokens after position {self.first} must be the answer but its last token "
                             f"(got {len(self.tokens)} tokens, answer {list(self.answer)})")


@dataclass
class FinetuneResult:
    """Where the fine-tuned model is, and how the run went."""

    folder: Path
    config: FinetuneConfig
    train_loss: list[float]  # per step: the batch's mean answer-token loss before the step's update
    eval_steps: list[int]
    eval_loss: list[float]  # the held-out loss after that many steps
    meta: dict = field(default_factory=dict)


def examples(model, task, *, protocol: str = DEFAULT_PROTOCOL) -> list[Example]:
    """The gold answer of every item of ``task`` as a training example, laid out as ``model`` (a loaded
    ``HookedTransformer``: its tokenizer and its family's BOS rule) evaluates it under ``protocol``."""
    out = []
    for i, item in enumerate(task):
        for row in item_rows(model, i, item, protocol):
            for choice, first, ids in row.reads:
                if choice == int(item.gold):
                    out.append(Example(tuple(row.tokens[:first + len(ids)]), first, tuple(ids)))
    if not out:
        raise InputError("the task gave no training examples: give a task with items")
    return out


def lr_at(step: int, cfg: FinetuneConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then linear decay to zero at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * max(0.0, (cfg.steps - step) / max(1, cfg.steps - cfg.warmup_steps))


def batch_at(n_examples: int, step: int, cfg: FinetuneConfig) -> list[int]:
    """The examples of step ``step``: drawn without replacement from a generator seeded by (seed, step)."""
    rng = np.random.default_rng([cfg.seed, step])
    return rng.choice(n_examples, size=min(cfg.batch_size, n_examples), replace=False).tolist()


def answer_loss(model, batch: Sequence[Example], pad_id: int) -> torch.Tensor:
    """Mean negative log-likelihood of the answer tokens of ``batch`` under the Hugging Face causal LM ``model``
    (rows right-padded; logits only where an answer token is predicted)."""
    device = next(model.parameters()).device
    width = max(len(e.tokens) for e in batch)
    tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    rows, cols, targets = [], [], []
    for b, e in enumerate(batch):
        tokens[b, :len(e.tokens)] = torch.tensor(e.tokens)
        mask[b, :len(e.tokens)] = 1
        for k, token in enumerate(e.answer):
            rows.append(b)
            cols.append(e.first + k)
            targets.append(token)
    hidden = model.base_model(input_ids=tokens.to(device), attention_mask=mask.to(device)).last_hidden_state
    logits = model.get_output_embeddings()(hidden[torch.tensor(rows), torch.tensor(cols)])
    return F.cross_entropy(logits.float(), torch.tensor(targets, device=device))


@torch.no_grad()
def held_out_loss(model, held_out: Sequence[Example], pad_id: int, batch_size: int) -> float:
    """The answer-token loss over ``held_out``, every answer token weighing the same."""
    total, n = 0.0, 0
    for start in range(0, len(held_out), batch_size):
        batch = held_out[start:start + batch_size]
        tokens = sum(len(e.answer) for e in batch)
        total += float(answer_loss(model, batch, pad_id)) * tokens
        n += tokens
    return total / max(n, 1)


def finetune(base_folder: str | Path, train: Sequence[Example], held_out: Sequence[Example], out_dir: str | Path,
             cfg: FinetuneConfig = FinetuneConfig(), *, describe: dict | None = None,
             progress: bool = True) -> FinetuneResult:
    """Fine-tune the Hugging Face model in ``base_folder`` on ``train`` (:func:`examples`) and write it to
    ``out_dir`` (module docstring). ``held_out``: examples the loss curve is measured on. ``describe``: what the
    data are (recorded with the run)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not train or not held_out:
        raise InputError("finetune needs training examples and held-out examples")
    out = Path(out_dir)
    key = run_key(base_folder, train, held_out, cfg)
    stored = _stored(out, key)
    if stored is not None:
        return stored
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": other, "weight_decay": 0.0}], lr=cfg.lr)
    train_loss: list[float] = []
    eval_steps, eval_loss = [0], [_eval(model, held_out, pad_id, cfg)]
    start = time.process_time()
    for step in tqdm(range(cfg.steps), desc="fine-tune", unit="step", disable=not progress):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = answer_loss(model, [train[i] for i in batch_at(len(train), step, cfg)], pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        train_loss.append(loss.item())
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            eval_steps.append(step + 1)
            eval_loss.append(_eval(model, held_out, pad_id, cfg))
    meta = dict(key=key, base=str(base_folder), n_train=len(train), n_held_out=len(held_out),
                train_tokens_seen=sum(len(train[i].tokens) for s in range(cfg.steps)
                                      for i in batch_at(len(train), s, cfg)),
                cpu_s=time.process_time() - start, threads=torch.get_num_threads(), data=describe or {},
                loss="mean negative log-likelihood of the gold answer's tokens given the context (nats per token)",
                schedule="AdamW, linear warm-up then linear decay to 0, gradient norm clipped")
    result = FinetuneResult(out, cfg, train_loss, eval_steps, eval_loss, meta)
    _save(model.eval(), tokenizer, result)
    return result


def _eval(model, held_out, pad_id: int, cfg: FinetuneConfig) -> float:
    was_training = model.training
    model.eval()
    loss = held_out_loss(model, held_out, pad_id, cfg.batch_size)
    model.train(was_training)
    return loss


def run_key(base_folder, train: Sequence[Example], held_out: Sequence[Example], cfg: FinetuneConfig) -> dict:
    """What must match for a stored fine-tune to be reused: the base weights' file, the data and the settings."""
    weights = Path(base_folder) / "model.safetensors"
    base = hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.exists() else str(base_folder)
    return canonical(dict(base=base, train=_digest(train), held_out=_digest(held_out), config=asdict(cfg)))


def _digest(data: Sequence[Example]) -> str:
    return hashlib.sha256(json.dumps([[list(e.tokens), e.first, list(e.answer)] for e in data]).encode()
                          ).hexdigest()[:16]


def _stored(out: Path, key: dict) -> FinetuneResult | None:
    record = out / RECORD
    if not record.exists():
        return None
    stored = json.loads(record.read_text())
    if stored.get("meta", {}).get("key") != key:
        raise InputError(f"{out} holds another fine-tune (other base, data or settings): pass a new out_dir, or "
                         "delete it to start over")
    return FinetuneResult(out, FinetuneConfig(**stored["config"]), stored["train_loss"], stored["eval_steps"],
                          stored["eval_loss"], stored["meta"])


def _save(model, tokenizer, result: FinetuneResult) -> None:
    """The weights (safetensors), the tokenizer and the record, written beside ``folder`` and moved in at once."""
    out = result.folder
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    atomic_write_json(partial / RECORD, dict(config=asdict(result.config), train_loss=result.train_loss,
                                             eval_steps=result.eval_steps, eval_loss=result.eval_loss,
                                             meta=result.meta))
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)

