"""Interactive attention patterns (circuitsvis) of the most and least active heads on example prompts.

``attention_heads`` (named heads, click to zoom) draws token strings as text on its canvas, so tokens are passed
as they are (escaping them would show "&lt;bos&gt;"); what must not happen is a token ending the inline <script>
that carries them, which ``script_safe`` prevents. ``.local_src`` inlines the JavaScript bundle, so the plot works
with no network.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.data.inputs import tokenize_inputs
from lens_heads.heads.scores import most_inactive
from lens_heads.models.backends import get_act_name

if TYPE_CHECKING:  # HookedTransformer is TransformerLens 3.9 only
    from transformer_lens import HookedTransformer


def pick_heads(mean_score: Float[Tensor, "layer head"], direction: str, k: int) -> dict[str, list[tuple[int, int]]]:
    """The ``k`` most active and ``k`` least active (layer, head) pairs by a score's mean over inputs.

    ``direction`` is the score's inactive side ('<': low means inactive, '>': high means inactive)."""
    order = most_inactive(mean_score, direction, mean_score.numel())
    k = min(k, len(order) // 2)
    return {"most active": order[::-1][:k], "least active": order[:k]}


def prompt_tokens(model: HookedTransformer, prompt: str) -> Tensor:
    """Tokens of one prompt as the library's scoring pass reads them (BOS as the model expects)."""
    tokens, _ = tokenize_inputs(model, [prompt])
    return tokens


@torch.no_grad()
def head_patterns(model: HookedTransformer, tokens: Tensor, heads: list[tuple[int, int]]
                  ) -> Float[Tensor, "n_heads query key"]:
    """Attention patterns of the given (layer, head) pairs for one tokenized prompt (only those layers hooked)."""
    layers = sorted({layer for layer, _ in heads})
    names = {get_act_name("pattern", layer) for layer in layers}
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    return torch.stack([cache[get_act_name("pattern", layer)][0, head] for layer, head in heads]).float().cpu()


def str_tokens(model: HookedTransformer, tokens: Tensor) -> list[str]:
    return list(cast(list[str], model.to_str_tokens(tokens[0])))  # one sequence in, one list of strings out


def render_attention(tokens: list[str], patterns: Float[Tensor, "n_heads query key"], names: list[str]) -> str:
    """circuitsvis ``attention_heads`` with its JS bundle inlined (no CDN), safe for any token text."""
    import circuitsvis as cv  # deferred: its import takes over a second

    rendered = cv.attention.attention_heads(attention=patterns, tokens=list(tokens), attention_head_names=names)
    return f'<div class="circuitsvis">{script_safe(rendered.local_src)}</div>'


def script_safe(src: str) -> str:
    """Make a circuitsvis render safe to inline, whatever its tokens hold.

    The props (tokens, names, values) are JSON inside a <script>: a token such as "</script>" or "<!--" would end
    or derail that script. "\\/" is the same character in a JS string, so "</" becomes "<\\/" in the props (which
    follow the bundle, between the last ``CircuitsVis.render(`` and the closing tag). The tokens reach the page as
    text (React text nodes and canvas labels), never as markup. circuitsvis also writes its mount point as <div .../>, which HTML does not
    self-close: it is closed here, so the rest of the page stays outside the element that React takes over.
    """
    start, end = src.rindex("CircuitsVis.render("), src.rindex("</script>")
    props = src[start:end].replace("</", "<\\/").replace("<!--", "<\\!--")
    src = src[:start] + props + src[end:]
    return re.sub(r'(<div id="circuits-vis-[^"]*"[^>]*?)\s*/>', r"\1></div>", src, count=1)
