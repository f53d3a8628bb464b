"""`rewrite`, zero-shot query rewriting (TOOLQP's idea without its training): one call rewrites the request into
one retrieval query in the vocabulary of API documentation; that query is searched as RtP's raw query is.
No query in the reply: nothing is searched and no planner called (as PtR without a stub), unless
`fallback_to_query` searches the raw query. The block's `trace` holds the query searched."""

from __future__ import annotations

from evaluator.study import prompts
from evaluator.study.archs.base import DEFERRED_KIND, Context, Discovery
from evaluator.study.parse import parse_query


class Rewrite:
    name = "rewrite"

    async def retrieve(self, ctx: Context) -> Discovery:
        reply = await ctx.chat(prompts.rewrite_messages(ctx.text), prompt_version=prompts.REWRITE_VERSION,
                               schema=prompts.REWRITE_SCHEMA)
        query, perr = parse_query(reply.content, ctx.text) if reply.error is None else ("", None)
        trace: dict = {"query": query or None, "parse_error": perr, "fallback": False}
        if not query and ctx.fallback_to_query and reply.error_kind != DEFERRED_KIND:
            query, trace["fallback"] = ctx.text, True
        if not query:
            return Discovery([], [], calls={"rewrite": reply}, trace=trace, plan=False)
        found = await ctx.search([query])
        return Discovery(list(found.merged.ids), list(found.merged.scores), calls={"rewrite": reply}, trace=trace,
                         plan=bool(found.merged.ids))
