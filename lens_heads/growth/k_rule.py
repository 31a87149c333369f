"""How many of a reference's first layers the first student inherits (k), by one stated rule on the reference's own
attention-rank profile in the paper's aggregation (the rank of each head's input-averaged attention matrix).

The paper's lazy layers are deep layers whose attention collapses; Inheritune keeps the layers before them. A rank
profile measured on a few dozen windows can also flag an isolated early layer, so the rule reads only the deep half
and lists every flagged layer beside the k it gives, the early ones included, so a reader sees what it left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from lens_heads.plumbing.errors import InputError

K_RULE = ("k = the first layer the reference's rank profile flags lazy at or past half its depth (a lazy layer is a "
          "deep layer whose attention collapses; flags in the first half are listed, not followed); where none is "
          "flagged there, half the depth")
PAPER_AGGREGATION = "matrix"  # `lens_heads.collapse.rank`: the rank of the input-averaged matrix


@dataclass(frozen=True)
class KChoice:
    """The k the rule gives, every layer the profile flags lazy, those in the deep half, and the first flagged
    anywhere (what the rule would take without its depth condition; None where nothing is flagged)."""

    k: int
    n_layers: int
    flagged: tuple[int, ...]
    deep_flagged: tuple[int, ...]
    first_flagged: int | None
    rule: str = K_RULE

    def to_dict(self) -> dict:
        return asdict(self)


def choose_k(profile: dict) -> KChoice:
    """`K_RULE` on a rank profile (``RankProfile.to_dict()``: its ``lazy`` flags per layer, its ``aggregation``),
    which must be in the paper's aggregation."""
    aggregation = profile.get("aggregation")
    if aggregation != PAPER_AGGREGATION:
        raise InputError(f"the k rule reads the paper's rank (aggregation {PAPER_AGGREGATION!r}: each head's attention "
                         f"matrix averaged over the inputs), got aggregation {aggregation!r}: measure the profile "
                         "with attention_rank(..., average=True)")
    lazy = [bool(x) for x in profile["lazy"]]
    n_layers = len(lazy)
    if n_layers < 2:
        raise InputError(f"a reference of {n_layers} layer(s) has no deep half to read k from")
    half = n_layers // 2
    flagged = tuple(i for i, flag in enumerate(lazy) if flag)
    deep = tuple(i for i in flagged if i >= half)
    return KChoice(k=deep[0] if deep else half, n_layers=n_layers, flagged=flagged, deep_flagged=deep,
                   first_flagged=flagged[0] if flagged else None)
