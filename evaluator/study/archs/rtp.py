"""`rtp`, Retrieve-then-Plan: the raw query's own top k (searched once for the whole study, before any call). A
query its retriever finds nothing for (BM25: no token of it in the registry) plans nothing and scores 0."""

from __future__ import annotations

from evaluator.study.archs.base import Context, Discovery


class RtP:
    name = "rtp"

    async def retrieve(self, ctx: Context) -> Discovery:
        ids = list(ctx.query_hits.ids)
        return Discovery(ids, list(ctx.query_hits.scores), plan=bool(ids))
