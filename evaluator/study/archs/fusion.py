"""`fusion`: reciprocal-rank fusion of RtP's and PtR's ranked lists, score(t) = sum_i 1 / (60 + rank_i(t)) (ranks
from 1; Cormack et al. 2009's constant, as the hybrid retriever's). It makes no call of its own before the
planner: PtR's discovery is reused (computed once per query, whoever asks), and counts in its tokens.
A query PtR retrieved nothing for (no stub, or a failed discovery) fuses RtP's list alone."""

from __future__ import annotations

from collections.abc import Sequence

from evaluator.retrieval.retrievers import RRF_K, rrf_scores
from evaluator.study.archs.base import Context, Discovery


def rrf(lists: Sequence[Sequence[str]], k_max: int, constant: int = RRF_K) -> tuple[list[str], list[float]]:
    """The fused list (ids, scores), best first; ties go to the id seen first (list order, then rank)."""
    score = rrf_scores((dict.fromkeys(ids) for ids in lists), constant)
    order = sorted(score, key=lambda i: -score[i])  # stable: first seen wins a tie
    return order[:k_max], [score[i] for i in order[:k_max]]


class Fusion:
    name = "fusion"

    async def retrieve(self, ctx: Context) -> Discovery:
        rtp, ptr = await ctx.outcome("rtp"), await ctx.outcome("ptr")
        ids, scores = rrf([rtp.ids, ptr.ids], ctx.k_max)
        return Discovery(ids, scores, reused={**rtp.calls, **ptr.calls}, trace={"fused": ["rtp", "ptr"], "constant": RRF_K},
                         plan=bool(ids))
