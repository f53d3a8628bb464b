"""`hyde`, hypothetical tool documents (the HyDE idea for tools, as ToolDreamer): one call writes, per sub-need of
the request, the documentation entry an API serving it would have (a name and one paragraph); each entry's
text (`name: description`) is searched and the union re-ranked by max similarity, as PtR's stubs are. The
block is a `PtrBlock`: its stubs are the entries, with each entry's hits."""

from __future__ import annotations

from evaluator.study import prompts
from evaluator.study.archs.base import Context, Discovery
from evaluator.study.archs.ptr import stub_discovery
from evaluator.study.parse import parse_documents


class HyDE:
    name = "hyde"

    async def retrieve(self, ctx: Context) -> Discovery:
        return await stub_discovery(ctx, "hyde", prompts.hyde_messages(ctx.text), prompts.HYDE_VERSION,
                                    prompts.HYDE_SCHEMA, parse_documents)
