"""`rtp`, Retrieve-then-Plan: the raw query's own top k (searched once for the whole study, before any call)."""

from __future__ import annotations

from evaluator.study.archs.base import Context, Discovery


class RtP:
    name = "rtp"

    async def retrieve(self, ctx: Context) -> Discovery:
        return Discovery(list(ctx.query_hits.ids), list(ctx.query_hits.scores))
