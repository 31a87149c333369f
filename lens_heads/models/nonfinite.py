"""Where a forward pass first goes NaN or infinite: the hook point, in the order they fire, whose output first holds
a non-finite value, so an error can say "layer 1's attention output" rather than "the log-likelihoods are NaN".

The forward runs without the caller's hooks: if it is finite, the hooks made the non-finite values, and the error
says that instead.
"""

from __future__ import annotations

import re
from typing import Sequence

import torch
from torch import Tensor

from lens_heads.plumbing.errors import NonFiniteError

LAYER = re.compile(r"blocks\.(\d+)\.")
# The hook points both backends fire without being switched on (hook_mlp_in, hook_result need flags), in the
# order of a block; not hook_attn_scores, which holds -inf at masked positions by design.
WATCHED = re.compile(r"(^hook_embed|^hook_pos_embed|\.hook_resid_pre|attn\.hook_[qkv]|attn\.hook_pattern|attn\.hook_z|"
                     r"\.hook_attn_out|\.hook_resid_mid|\.hook_mlp_out|\.hook_resid_post)$")


def first_nonfinite(model, tokens: Sequence[int]) -> str | None:
    """The first hook point (e.g. ``"blocks.1.hook_attn_out"``) whose output is non-finite when ``model`` runs
    ``tokens`` alone and unhooked; ``"the unembedding"`` where only the logits are; None where all is finite."""
    seen: list[str] = []

    def watch(x: Tensor, hook) -> None:
        if not seen and torch.is_tensor(x) and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            seen.append(hook.name)

    pairs = [(name, watch) for name in model.hook_dict if WATCHED.search(name)]
    ids = torch.tensor([list(tokens)], device=model.cfg.device)
    with torch.no_grad(), model.hooks(fwd_hooks=pairs):
        logits = model(ids)
    if seen:
        return seen[0]
    return None if bool(torch.isfinite(logits).all()) else "the unembedding"


def where_nonfinite(model, tokens: Sequence[int]) -> str:
    """A sentence saying where ``tokens``' forward first went non-finite (for error messages)."""
    name = first_nonfinite(model, tokens)
    if name is None:
        return ("the model's own forward is finite on it, so the hooks made the non-finite values (a mean ablation "
                "of NaN means, a hook returning NaN)")
    layer = LAYER.match(name)
    where = f"layer {layer.group(1)}'s {name.split('.', 2)[2]}" if layer else name
    return (f"its first non-finite value is at {name} ({where}) of the unhooked forward: check that layer's weights "
            "(NaN in a checkpoint, a diverged fine-tune) or, in float16/bfloat16, load the model in float32")


def refuse_nonfinite_forward(model, inputs: Sequence[Sequence[int]], what: str) -> None:
    """Raise a :class:`NonFiniteError` if the unhooked forward of any of ``inputs`` (token lists) goes non-finite:
    the guard of computations that would otherwise read NaN activations as numbers (``what`` names them)."""
    for k, tokens in enumerate(inputs):
        if first_nonfinite(model, tokens) is not None:
            raise NonFiniteError(f"{what}: the forward of input {k} goes NaN or infinite, so no number is computed "
                                 f"from it; {where_nonfinite(model, tokens)}")


def refuse_nonfinite_values(values, what: str, advice: str = "") -> None:
    """Raise a :class:`NonFiniteError` if ``values`` (a tensor or array) hold NaN or infinity: the guard of numbers
    that did not come from a forward this module can replay (given scores, a matrix, a loss). ``what`` names them;
    ``advice`` says where they came from or what to do."""
    tensor = values if torch.is_tensor(values) else torch.as_tensor(values)
    if not tensor.is_floating_point() and not tensor.is_complex():
        return
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        first = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
        raise NonFiniteError(f"{what}: {int(bad.sum())} of {tensor.numel()} values are NaN or infinite (the first at "
                             f"index {first}), so no number is computed from them" + (f"; {advice}" if advice else ""))
