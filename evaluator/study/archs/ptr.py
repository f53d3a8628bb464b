"""`ptr`, Plan-then-Retrieve: one discovery call writes Abstract Tool Stubs; each stub's text is searched and the
union re-ranked by max similarity (STUDY.md). `stub_discovery` is the shape hyde shares: one call whose reply
is parsed into named texts, each searched, kept in a `PtrBlock` with every text's hits."""

from __future__ import annotations

from collections.abc import Callable

from evaluator.results.plans import Stub, stub_text
from evaluator.results.schema import PtrBlock, round6
from evaluator.study import prompts
from evaluator.study.archs.base import DEFERRED_KIND, Context, Discovery
from evaluator.study.parse import parse_stubs

Parser = Callable[[str | None, str], tuple[list[Stub], str | None]]


async def stub_discovery(ctx: Context, call: str, messages: list[dict], version: str, schema: dict,
                         parse: Parser) -> Discovery:
    """One call -> stubs (`parse`) -> each stub's text searched -> the max-similarity merge. No stub: nothing is
    searched and no planner called (counted in Gen%), unless `fallback_to_query` searches the raw query."""
    reply = await ctx.chat(messages, prompt_version=version, schema=schema)
    stubs, perr = parse(reply.content, ctx.text) if reply.error is None else ([], None)
    texts = [stub_text(st) for st in stubs]
    fallback = not texts and ctx.fallback_to_query
    if fallback:
        texts = [ctx.text]
    block = PtrBlock(stubs=list(stubs), discovery_parse_error=perr, discovery_llm_error=reply.error,
                     discovery_finish_reason=reply.finish_reason, discovery_llm_error_kind=reply.error_kind,
                     fallback=fallback, discovery_cut=getattr(reply, "cut", None))
    if not texts or reply.error_kind == DEFERRED_KIND:
        block.width = {k: 0 for k in ctx.ks}
        return Discovery([], [], calls={call: reply}, block=block, plan=False)
    found = await ctx.search(texts)
    block.stub_hits = [list(h.ids) for h in found.per_text]
    block.stub_scores = [[round6(s) for s in h.scores] for h in found.per_text]
    block.width = dict(found.width)
    # every text found nothing (BM25: no token in the registry): nothing to plan with, as without a stub
    return Discovery(list(found.merged.ids), list(found.merged.scores), calls={call: reply}, block=block,
                     plan=bool(found.merged.ids))


def _stubs(text: str | None, query: str) -> tuple[list[Stub], str | None]:
    return parse_stubs(text, query=query)


class PtR:
    name = "ptr"

    async def retrieve(self, ctx: Context) -> Discovery:
        return await stub_discovery(ctx, "discovery", prompts.discovery_messages(ctx.text), prompts.DISCOVERY_VERSION,
                                    prompts.DISCOVERY_SCHEMA, _stubs)
