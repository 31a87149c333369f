"""The head scores of "Identifying and Evaluating Inactive Heads in Pretrained LLMs" (Sandoval-Segura et al.).

Each score is a small named function of ONE layer's activations, for every input and query head at once:

    pattern  A[b, h, i, j]   causal softmax attention (``hook_pattern``)
    v        v[b, j, h, d]   value vectors, grouped-query K/V heads already expanded to query heads (``hook_v``)
    z        o[b, i, h, d]   head outputs before W_O, o_i = sum_j A[i, j] v_j (``hook_z``)
    mask     P[b, i]         True at non-padding positions

"First token" is the first non-padding position (the BOS), "last token" the last non-padding one; means run over
non-padding positions only, and the first token is never excluded. The six base scores:

    AWFT   mean_i A[i, first]             inactive when >  threshold (the attention-sink criterion)
    AEQD   mean_i entropy(A[i, :])        inactive when <  threshold
    FTVVN  |v_first|                      inactive when <  threshold
    AVVN   mean_j |v_j|                   inactive when <  threshold
    LTHON  |o_last|                       inactive when <  threshold
    AHON   mean_i |o_i|                   inactive when <  threshold

The layer-normalised "(LN)" variants divide by the plain mean of the same score over the heads of the layer (same
input), except LTHON (LN), which the paper divides by the layer mean of AHON. They are derived from the base scores
by :func:`layer_normalised`, not written again. Where a whole layer scores 0 (AEQD of a one-token input), 0/0 is
taken as 1: all heads tie at the layer mean.

A score is a :class:`Score`; a new one is a few lines (``Score("MY", "<", lambda layer: ...)``) passed to
:func:`scores_of_layer` or ``score_heads(..., extras=[...])``; the streaming pass needs no change. ``Score.reads``
names the activations it needs. AWFT and AEQD need only two numbers per query row (the weight on the first token, the
entropy), which :meth:`Layer.rows` reads a chunk of rows at a time, from ``hook_pattern`` or recomputed from the
layer's queries and keys, or takes from one fused attention's log-sum-exp (:mod:`lens_heads.heads.attention_rows`): the scoring pass and the per-input zeroing then
run fused attention (:mod:`lens_heads.evaluation.fused_attention`) and never hold a layer's whole pattern. A Score of
your own that reads ``layer.pattern`` whole gets it captured (the layer then runs eagerly).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lens_heads.heads.attention_rows import (
    DEFAULT_QUERY_CHUNK,
    QueryKeys,
    RowStatistics,
    check_query_chunk,
    row_statistics,
)
from lens_heads.plumbing.errors import InputError

ACTIVATIONS = ("pattern", "v", "z")

# ---------------------------------------------------------------- one layer's activations


@dataclass(eq=False)
class Layer:
    """One layer's activations and the score values computed on them so far (each score is computed once)."""

    pattern: Float[Tensor, "batch head q k"] | None
    v: Float[Tensor, "batch k head d_head"] | None
    z: Float[Tensor, "batch q head d_head"]
    mask: Bool[Tensor, "batch pos"]
    W_O: Float[Tensor, "head d_head d_model"] | None = None
    causal: bool = False  # True promises A[i, j] = 0 for keys after the query: lets entropy skip them
    # the pattern's rows computed from queries and keys where no pattern was captured (lens_heads.heads.attention_rows)
    query_keys: QueryKeys | None = None
    query_chunk: int = DEFAULT_QUERY_CHUNK
    _values: dict = field(default_factory=dict, repr=False)
    _rows: RowStatistics | None = field(default=None, repr=False)

    def value(self, score: "Score") -> Float[Tensor, "batch head"]:
        if score.name not in self._values:
            self._values[score.name] = score.fn(self)
        return self._values[score.name]

    def rows(self) -> RowStatistics:
        """Each query row's weight on the first token and entropy, read ``query_chunk`` rows at a time from the
        pattern (or, without one, from ``query_keys``); computed once for the scores that read the pattern."""
        if self._rows is None:
            source = self.pattern if self.pattern is not None else self.query_keys
            if source is None:
                raise InputError("this score reads pattern, which the layer lacks: list 'pattern' in its Score.reads")
            causal = source.causal if isinstance(source, QueryKeys) else self.causal
            self._rows = row_statistics(source, self.first, causal=causal, query_chunk=self.query_chunk)
        return self._rows

    @property
    def first(self) -> Tensor:
        """Index of the first non-padding position of each input, [batch]."""
        return self.mask.int().argmax(dim=1)

    @property
    def last(self) -> Tensor:
        """Index of the last non-padding position of each input, [batch]."""
        return self.mask.shape[1] - 1 - self.mask.flip(1).int().argmax(dim=1)

    def mean_over_positions(self, x: Float[Tensor, "batch head pos"]) -> Float[Tensor, "batch head"]:
        """Mean over the non-padding positions (padding entries may hold anything, NaN included)."""
        m = self.mask[:, None, :]
        return torch.where(m, x, 0.0).sum(-1) / m.sum(-1)


@dataclass(frozen=True)
class Score:
    """A named head score: ``fn(layer) -> [batch, head]``; ``direction`` is the inactive side ('<' or '>');
    ``reads``: which of the layer's ``pattern``, ``v``, ``z`` it uses (the mask is always there)."""

    name: str
    direction: str
    fn: Callable[[Layer], Float[Tensor, "batch head"]]
    description: str = ""
    reads: frozenset[str] = frozenset(ACTIVATIONS)

    def __post_init__(self):
        if self.direction not in ("<", ">"):
            raise InputError(f"score {self.name!r}: direction must be '<' or '>', got {self.direction!r}")


# ---------------------------------------------------------------- the six base scores


def _at(x: Float[Tensor, "batch pos head d"], index: Tensor) -> Float[Tensor, "batch head d"]:
    return x[torch.arange(x.shape[0], device=x.device), index.to(x.device)]


def _read(x: Tensor | None, name: str) -> Tensor:
    if x is None:
        raise InputError(f"this score reads {name}, which the layer lacks: list {name!r} in its Score.reads")
    return x


def average_weight_of_first_token(layer: Layer) -> Float[Tensor, "batch head"]:
    """AWFT: the attention weight each query puts on the first token, averaged over the queries,
    ``mean_{i in P} A[i, first]``. A head that sends (nearly) all its attention to the first token (an attention
    sink) writes little of the rest of the input: inactive when the score is *above* the threshold. The attention-sink
    criterion of earlier work, which the paper finds removes the fewest heads."""
    return layer.mean_over_positions(layer.rows().first_weight)


def average_entropy_of_query_distributions(layer: Layer) -> Float[Tensor, "batch head"]:
    """AEQD: the entropy (nats) of each query's attention distribution, averaged over the queries,
    ``mean_{i in P} -sum_j A[i, j] ln A[i, j]``. A head whose queries all attend to one or a few keys (low entropy) is
    taken as inactive: inactive when the score is *below* the threshold."""
    return layer.mean_over_positions(layer.rows().entropy)


def first_token_value_vector_norm(layer: Layer) -> Float[Tensor, "batch head"]:
    """FTVVN: the L2 norm of the first token's value vector, ``|v_first|``. A sink head attends to the first
    token, so a small value there means it writes (nearly) nothing: inactive when the score is *below* the
    threshold."""
    return _at(_read(layer.v, "v"), layer.first).norm(dim=-1)


def average_value_vector_norm(layer: Layer) -> Float[Tensor, "batch head"]:
    """AVVN: the L2 norm of the value vectors, averaged over the positions, ``mean_{j in P} |v_j|``. Small values
    everywhere bound the head's output whatever it attends to: inactive when the score is *below* the threshold."""
    return layer.mean_over_positions(_read(layer.v, "v").norm(dim=-1).transpose(1, 2))


def last_token_head_output_norm(layer: Layer) -> Float[Tensor, "batch head"]:
    """LTHON: the L2 norm of the head's output (before ``W_O``) at the last non-padding position, ``|o_last|``,
    ``o_i = sum_j A[i, j] v_j``: what the head adds where the next token is predicted. Inactive when the score is
    *below* the threshold."""
    return _at(layer.z, layer.last).norm(dim=-1)


def average_head_output_norm(layer: Layer) -> Float[Tensor, "batch head"]:
    """AHON: the L2 norm of the head's output (before ``W_O``), averaged over the positions,
    ``mean_{i in P} |o_i|``: how much the head writes at all. Inactive when the score is *below* the threshold; its
    layer-normalised form, AHON (LN), is the paper's most robust score."""
    return layer.mean_over_positions(layer.z.norm(dim=-1).transpose(1, 2))


AWFT = Score("AWFT", ">", average_weight_of_first_token, "average attention weight on the first token",
             frozenset({"pattern"}))
AEQD = Score("AEQD", "<", average_entropy_of_query_distributions, "average entropy of the query distributions (nats)",
             frozenset({"pattern"}))
FTVVN = Score("FTVVN", "<", first_token_value_vector_norm, "L2 norm of the first token's value vector",
              frozenset({"v"}))
AVVN = Score("AVVN", "<", average_value_vector_norm, "average L2 norm of the value vectors", frozenset({"v"}))
LTHON = Score("LTHON", "<", last_token_head_output_norm, "L2 norm of the head output (before W_O) at the last token",
              frozenset({"z"}))
AHON = Score("AHON", "<", average_head_output_norm, "average L2 norm of the head output (before W_O)",
             frozenset({"z"}))
BASE_SCORES = (AWFT, AEQD, FTVVN, AVVN, LTHON, AHON)


# ---------------------------------------------------------------- derived scores


def layer_normalised(score: Score, denominator: Score | None = None, *, name: str | None = None,
                     doc: str | None = None) -> Score:
    """``score`` divided by the mean of ``denominator`` (default: ``score`` itself) over the heads of the layer
    (``doc``: the new score's function's docstring)."""
    denominator = denominator or score

    def fn(layer: Layer) -> Float[Tensor, "batch head"]:
        x, mean = layer.value(score), layer.value(denominator).mean(-1, keepdim=True)
        # 0 / 0 (e.g. AEQD of a one-token input: every head has entropy 0) means all heads tie: call it 1.
        return torch.where((x == 0) & (mean == 0), 1.0, x / mean)

    fn.__name__ = fn.__qualname__ = f"{score.fn.__name__}_layer_normalised"
    fn.__doc__ = doc

    by = "" if denominator is score else f" of {denominator.name}"
    return Score(name or f"{score.name} (LN)", score.direction, fn,
                 f"{score.name} divided by the layer's mean{by} over heads", score.reads | denominator.reads)


def head_normalised(score: Score, denominator: Score, *, name: str) -> Score:
    """``score`` divided by ``denominator`` of the same head."""
    return Score(name, score.direction, lambda layer: layer.value(score) / layer.value(denominator),
                 f"{score.name} divided by the same head's {denominator.name}", score.reads | denominator.reads)


_SAME = ("{base} (LN): {base} of the head divided by the mean {base} of the layer's heads on the same input, so that heads are "
         "compared with their own layer (norms and entropies differ in scale from layer to layer): {what}. "
         "Inactive when the score is {side} the threshold; 1 where the whole layer scores 0.")
LN_DOCS = {
    "AWFT": _SAME.format(base="AWFT", side="*above*", what="a head that sinks more attention into the first token "
                         "than its layer does on average"),
    "AEQD": _SAME.format(base="AEQD", side="*below*", what="a head whose queries attend more narrowly than its "
                         "layer's"),
    "FTVVN": _SAME.format(base="FTVVN", side="*below*", what="a first-token value small for its layer"),
    "AVVN": _SAME.format(base="AVVN", side="*below*", what="values small for their layer"),
    "LTHON": ("LTHON (LN): the head's output norm at the last token divided by the layer's mean AHON (its heads' "
              "average output norm over the positions) on the same input, ``|o_last| / mean_heads AHON``: the paper's "
              "exception, which normalises by the average output and not by the layer's mean LTHON. Inactive when "
              "the score is *below* the threshold."),
    "AHON": _SAME.format(base="AHON", side="*below*", what="a head that writes little for its layer (the paper's "
                         "most robust score: best normalised AUC on 8 of 14 models)"),
}
LN_SCORES = tuple(layer_normalised(s, AHON if s is LTHON else None, doc=LN_DOCS[s.name]) for s in BASE_SCORES)
SCORES: tuple[Score, ...] = BASE_SCORES + LN_SCORES
SCORE_NAMES: list[str] = [s.name for s in SCORES]
DIRECTION: dict[str, str] = {s.name: s.direction for s in SCORES}


def score_names(text: str) -> tuple[str, ...]:
    """Comma-separated score names as in the paper, case, spaces and punctuation ignored ("ahon_ln" is "AHON (LN)");
    "all" for the twelve, "" for none."""
    if text.strip().lower() == "all":
        return tuple(SCORE_NAMES)
    key = lambda name: "".join(c for c in name.lower() if c.isalnum())  # noqa: E731
    by_key = {key(name): name for name in SCORE_NAMES}
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in wanted if key(name) not in by_key]
    if bad:
        raise InputError(f"unknown score {', '.join(map(repr, bad))}: choose from {', '.join(SCORE_NAMES)} or 'all' "
                         "(comma-separated)")
    return tuple(dict.fromkeys(by_key[key(name)] for name in wanted))


# ---------------------------------------------------------------- optional extras (kept apart from the twelve)


def _full_output_norm(z: Float[Tensor, "batch pos head d_head"], W_O: Float[Tensor, "head d_head d_model"]
                      ) -> Float[Tensor, "batch pos head"]:
    # |o W_O[h]|^2 = o^T (W_O[h] W_O[h]^T) o: a [head, d_head, d_head] Gram matrix instead of a d_model-wide tensor.
    gram = torch.einsum("hdm,hem->hde", W_O, W_O).to(z.dtype)
    squared = torch.einsum("bphd,hde,bphe->bph", z, gram, z)
    return squared.clamp_min(0).sqrt()


def _needs_W_O(layer: Layer) -> Tensor:
    if layer.W_O is None:
        raise InputError("full-head-output scores need W_O: pass W_O to scores_of_layer (score_heads does this)")
    return layer.W_O


def last_token_full_output_norm(layer: Layer) -> Float[Tensor, "batch head"]:
    norms = _full_output_norm(layer.z, _needs_W_O(layer))
    return norms[torch.arange(norms.shape[0], device=norms.device), layer.last.to(norms.device)]


def average_full_output_norm(layer: Layer) -> Float[Tensor, "batch head"]:
    return layer.mean_over_positions(_full_output_norm(layer.z, _needs_W_O(layer)).transpose(1, 2))


LTHON_FULL = Score("LTHON (full)", "<", last_token_full_output_norm,
                   "L2 norm of the head's output after its slice of W_O (d_model space) at the last token",
                   frozenset({"z"}))
AHON_FULL = Score("AHON (full)", "<", average_full_output_norm,
                  "average L2 norm of the head's output after its slice of W_O (d_model space)", frozenset({"z"}))
EXTRA_SCORES: tuple[Score, ...] = (
    head_normalised(LTHON, AHON, name="LTHON (HN)"),
    LTHON_FULL,
    AHON_FULL,
    layer_normalised(LTHON_FULL, AHON_FULL, name="LTHON (full, LN)"),
    layer_normalised(AHON_FULL, name="AHON (full, LN)"),
)
EXTRA_NAMES: list[str] = [s.name for s in EXTRA_SCORES]


# Each variant's base score: "AHON (LN)" -> "AHON". Curves of one family share a colour in the figures.
_FAMILY = {**{ln.name: s.name for s, ln in zip(BASE_SCORES, LN_SCORES)},
           **{extra.name: base.name for extra, base in zip(EXTRA_SCORES, (LTHON, LTHON, AHON, LTHON, AHON))}}
LN_NAMES = frozenset(s.name for s in LN_SCORES)


def base_score(name: str) -> str:
    """The base score a score belongs to ("AHON (LN)" -> "AHON"); any other name is its own base."""
    return _FAMILY.get(name, name)


def get_score(name: str) -> Score:
    """The registered score called ``name`` (one of SCORE_NAMES or EXTRA_NAMES)."""
    for s in SCORES + EXTRA_SCORES:
        if s.name == name:
            return s
    raise InputError(f"unknown score {name!r}: choose one of {SCORE_NAMES + EXTRA_NAMES}")


def as_scores(scores: Sequence[Score | str]) -> tuple[Score, ...]:
    """Score objects from a mix of names and objects, checking that names are unique."""
    out = tuple(get_score(s) if isinstance(s, str) else s for s in scores)
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise InputError(f"duplicate score names in {names}")
    return out


# ---------------------------------------------------------------- one layer, all scores


def scores_of_layer(
    pattern: Float[Tensor, "batch head q k"] | None,
    v: Float[Tensor, "batch k head d_head"] | None,
    z: Float[Tensor, "batch q head d_head"],
    mask: Bool[Tensor, "batch pos"],
    scores: Sequence[Score | str] = SCORES,
    *,
    W_O: Float[Tensor, "head d_head d_model"] | None = None,
    causal: bool = False,
    query_keys: QueryKeys | None = None,
    query_chunk: int = DEFAULT_QUERY_CHUNK,
) -> Float[Tensor, "batch head n_scores"]:
    """All ``scores`` (default: the twelve, in SCORE_NAMES order) of one layer, for every input and head.

    ``v`` must already be expanded to query heads (``lens_heads.models.loading.expand_kv``). ``pattern`` or ``v`` may be
    None where no score reads it (``Score.reads``). Every input needs at least one non-padding position. ``W_O`` is
    needed only by the full-head-output extras. ``causal=True`` promises a causal pattern (no weight on later keys)
    and lets the entropy skip the upper triangle. The registered scores read the pattern
    ``query_chunk`` rows at a time, and from ``query_keys`` (:mod:`lens_heads.heads.attention_rows`) where ``pattern``
    is None, so the layer's whole pattern is never needed; a Score of your own reading ``layer.pattern`` needs it.
    """
    scores = as_scores(scores)
    given = {"pattern": pattern if pattern is not None else query_keys, "v": v, "z": z}
    missing = sorted({name for s in scores for name in s.reads if given[name] is None})
    if missing:
        raise InputError(f"the scores {[s.name for s in scores]} read {missing}: pass them to scores_of_layer")
    b, q, h = z.shape[:3]
    k = (pattern.shape[-1] if pattern is not None else query_keys.k.shape[1] if query_keys is not None
         else v.shape[1] if v is not None else q)
    if ((pattern is not None and tuple(pattern.shape) != (b, h, q, k))
            or (query_keys is not None and pattern is None and (query_keys.q.shape[:3] != (b, q, h)
                                                                 or query_keys.k.shape[:3] != (b, k, h)))
            or (v is not None and v.shape[:3] != (b, k, h)) or tuple(mask.shape) != (b, q)):
        shape = lambda x: None if x is None else tuple(x.shape)  # noqa: E731
        qk = "" if query_keys is None else f", queries {shape(query_keys.q)}, keys {shape(query_keys.k)}"
        raise InputError(f"shapes disagree: pattern {shape(pattern)}, v {shape(v)} (expand KV heads "
                         f"first), z {shape(z)}, mask {shape(mask)}{qk}")
    mask = mask.to(device=z.device, dtype=torch.bool)
    if not bool(mask.any(dim=1).all()):
        raise InputError("every input needs at least one non-padding position in mask")
    layer = Layer(pattern, v, z, mask, W_O, causal, query_keys, check_query_chunk(query_chunk))
    return torch.stack([layer.value(s) for s in scores], dim=-1)


def inactive(values: Tensor, direction: str, threshold: float) -> Bool[Tensor, "..."]:
    """Which values are on the inactive side of ``threshold`` (strictly: ``<`` or ``>`` as ``direction`` says)."""
    if direction == "<":
        return values < threshold
    if direction == ">":
        return values > threshold
    raise InputError(f"direction must be '<' or '>', got {direction!r}")


def most_inactive(mean: Float[Tensor, "layer head"], direction: str, k: int) -> list[tuple[int, int]]:
    """The ``k`` most inactive ``(layer, head)`` pairs by a score's per-head ``mean``, most inactive first: lowest
    first for a ``"<"`` score, highest first for ``">"``; equal means keep layer-head order."""
    if direction not in ("<", ">"):
        raise InputError(f"direction must be '<' or '>', got {direction!r}")
    values = torch.as_tensor(mean).double()
    n_heads = values.shape[1]
    order = torch.argsort((values if direction == "<" else -values).reshape(-1), stable=True)
    return [(int(i) // n_heads, int(i) % n_heads) for i in order[:k].tolist()]


def what_still_works(missing: list[str]) -> str:
    """Which scores a model lacking the ``missing`` attention hooks can still compute (for error messages)."""
    if "hook_z" in missing:
        return "Without hook_z no head can be scored or zeroed here; evaluate() without ablation still works."
    needs = {"hook_pattern": "pattern", "hook_v": "v"}
    lost = {needs[m] for m in missing if m in needs}
    works = [s.name for s in SCORES if not (s.reads & lost)]
    return f"Scores that read only hook_z still work: {', '.join(works) or 'none'}."
