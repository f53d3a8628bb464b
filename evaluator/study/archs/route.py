"""`route`: live complexity-adaptive routing (the paper's proposal, STUDY.md "Beyond the paper"): a query goes to
RtP when RtP's top-1 score is at least τ, else to PtR. It takes that side's whole outcome (its list, its
planner reply, its tokens: only what that side spent) and makes no call of its own; the block's `side` says
which, its trace the score and τ. τ is `[run] route_tau`; unset, it is the median of RtP's top-1 scores over
the study's queries (known before any call, no gold used: half the queries each way, on any retriever's score
scale)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from evaluator.study.archs.base import Context, Discovery


def default_tau(top1: Sequence[float]) -> float:
    """The median of RtP's top-1 scores (0.0 with no query)."""
    return float(statistics.median(top1)) if top1 else 0.0


def route_side(rtp_scores: Sequence[float], tau: float) -> str:
    """The architecture a query goes to: RtP when its top-1 score is at least τ (no hit: PtR)."""
    return "rtp" if rtp_scores and rtp_scores[0] >= tau else "ptr"


class Route:
    name = "route"

    def __init__(self, tau: float) -> None:
        self.tau = tau

    async def retrieve(self, ctx: Context) -> Discovery:
        rtp = await ctx.outcome("rtp")
        scores = rtp.scores or []  # an outcome handed on is checked: its scores are filled
        side = route_side(scores, self.tau)
        return Discovery([], [], side=side, trace={"side": side, "top1": scores[0] if scores else None,
                                                  "tau": self.tau})
