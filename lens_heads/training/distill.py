"""Knowledge distillation from a trained reference (the teacher): the paper's distillation baselines.

The loss on a window of tokens, every position a prediction (no padding in language-model windows):

    kd_weight * T^2 * KL(softmax(teacher / T) || softmax(student / T))     (Hinton et al. 2015; mean over positions)
  + lm_weight * cross-entropy of the next token                              (the student's own language-model loss)
  + cosine_weight * (1 - cos(student hidden, teacher hidden))               (DistilBERT's cosine loss)

The T^2 factor keeps the soft term's gradients at the size of the hard term's as T changes (Hinton et al.). The
hidden states are the final LayerNorm's output (``ln_final.hook_normalized``, what the unembedding reads; Hugging
Face GPT-2's last hidden state), so the cosine term needs the teacher's width.

Two settings (`DistillConfig`): ``logit()``, the student trained on the teacher's logits mixed half and half with
its own loss at T = 2; ``distilbert()``, DistilBERT's weights (Sanh et al. 2019: 5 soft, 2 language-model, 1
cosine, T = 2; for GPT-2 the masked-LM term is the causal one, as DistilGPT-2 was trained).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

HIDDEN = "ln_final.hook_normalized"


@dataclass(frozen=True)
class DistillConfig:
    """Weights of the three terms and the temperature of the soft one (see the module docstring)."""

    temperature: float = 2.0
    kd_weight: float = 0.5
    lm_weight: float = 0.5
    cosine_weight: float = 0.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise InputError(f"distillation temperature must be > 0, got {self.temperature}: the soft targets are "
                             "softmax(logits / T) (T = 1: the teacher's own distribution; 2 is usual)")
        weights = {k: getattr(self, k) for k in ("kd_weight", "lm_weight", "cosine_weight")}
        if any(not w >= 0 for w in weights.values()) or not any(weights.values()):
            raise InputError(f"distillation weights must be >= 0 and not all 0, got {weights}")

    @classmethod
    def logit(cls, temperature: float = 2.0, kd_weight: float = 0.5) -> DistillConfig:
        """Logit distillation: ``kd_weight`` of the soft term, the rest the language-model loss."""
        if not 0 <= kd_weight <= 1:
            raise InputError(f"kd_weight mixes the soft and the language-model loss: give 0..1, got {kd_weight}")
        return cls(temperature=temperature, kd_weight=kd_weight, lm_weight=1 - kd_weight)

    @classmethod
    def distilbert(cls, temperature: float = 2.0) -> DistillConfig:
        """DistilBERT's loss weights (soft 5, language model 2, cosine 1)."""
        return cls(temperature=temperature, kd_weight=5.0, lm_weight=2.0, cosine_weight=1.0)

    def to_dict(self) -> dict:
        return asdict(self)


def distillation_loss(student_logits: Float[Tensor, "batch pos vocab"], teacher_logits: Float[Tensor, "batch pos vocab"],
                      targets: Int[Tensor, "batch pos"], config: DistillConfig,
                      student_hidden: Float[Tensor, "batch pos d_model"] | None = None,
                      teacher_hidden: Float[Tensor, "batch pos d_model"] | None = None) -> Tensor:
    """The weighted loss of the module docstring, a scalar (means over positions)."""
    if student_logits.shape != teacher_logits.shape:
        raise InputError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ: distil a student with the teacher's vocabulary")
    T = config.temperature
    s, t = student_logits.flatten(0, 1).float(), teacher_logits.flatten(0, 1).float()
    loss = s.new_zeros(())
    if config.kd_weight:
        kl = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True, reduction="batchmean")
        loss = loss + config.kd_weight * T**2 * kl
    if config.lm_weight:
        loss = loss + config.lm_weight * F.cross_entropy(s, targets.flatten())
    if config.cosine_weight:
        if student_hidden is None or teacher_hidden is None:
            raise InputError("the cosine term needs the student's and the teacher's hidden states")
        if student_hidden.shape != teacher_hidden.shape:
            raise InputError(f"the cosine term compares hidden states of equal width: student "
                             f"{tuple(student_hidden.shape)}, teacher {tuple(teacher_hidden.shape)}")
        cos = F.cosine_similarity(student_hidden.flatten(0, 1).float(), teacher_hidden.flatten(0, 1).float(), dim=-1)
        loss = loss + config.cosine_weight * (1 - cos).mean()
    return loss


def logits_and_hidden(model: HookedTransformer, tokens: Int[Tensor, "batch pos"],
                      hidden: bool) -> tuple[Tensor, Tensor | None]:
    """The logits and (with ``hidden``) the final LayerNorm's output, with their graph (not detached)."""
    if not hidden:
        return model(tokens), None
    store: dict[str, Tensor] = {}

    def keep(value: Tensor, hook) -> None:
        store["hidden"] = value

    with model.hooks(fwd_hooks=[(HIDDEN, keep)]):
        logits = model(tokens)
    return logits, store["hidden"]


@dataclass
class Distillation:
    """A training objective for `lens_heads.training.loop.train` (``objective=``): the `distillation_loss` of the
    student against ``teacher`` (frozen: run without gradients, in eval mode) on each training window."""

    teacher: HookedTransformer
    config: DistillConfig

    def __post_init__(self):
        self.teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)

    def __call__(self, model: HookedTransformer, windows: Int[Tensor, "batch seq_plus_1"]) -> Tensor:
        inputs, targets = windows[:, :-1], windows[:, 1:]
        hidden = bool(self.config.cosine_weight)
        with torch.no_grad():
            t_logits, t_hidden = logits_and_hidden(self.teacher, inputs, hidden)
        s_logits, s_hidden = logits_and_hidden(model, inputs, hidden)
        return distillation_loss(s_logits, t_logits, targets, self.config, s_hidden, t_hidden)

    def describe(self) -> dict:
        """What a run's checkpoints depend on besides the data and the student: the loss and the teacher."""
        t = self.teacher.cfg
        with torch.no_grad():  # a fingerprint of the weights: a retrained teacher is another run
            total = float(sum(p.double().sum().item() for p in self.teacher.parameters()))
        return {"distillation": self.config.to_dict(),
                "teacher": {"name": t.model_name, "weights_sum": round(total, 6),
                            **{k: getattr(t, k) for k in ("n_layers", "d_model", "n_heads", "d_vocab")}}}
