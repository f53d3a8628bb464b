"""An example architecture plugin: search each clause of the request on its own, merge by max score.

Run it beside the built-ins:

    python -m evaluator --model sim --runs 1 --archs rtp,ptr,examples/arch_plugin/clauses.py:Clauses

A plugin is a class with a `name` (the key of its results) and `async def retrieve(self, ctx) -> Discovery`,
made without arguments. `ctx.search(texts)` searches the study's retriever (dense, bm25 or hybrid) and
merges the texts' hits by their best score, as PtR merges its stubs; `ctx.chat(...)` calls the model
through the evaluator's engine (cache, rate limits, retries, batch, dry run); `ctx.outcome("rtp")` is another
architecture's outcome for the same query. The evaluator then asks the planner with the top k of the list
returned, as for every architecture. This one makes no LLM call: it splits the request at sentence ends
and at "and"/"then"/"also" (a cheap decomposition, the clause-count proxy of the paper's routing section).
"""

from __future__ import annotations

import re

from evaluator.study.archs import Context, Discovery

_CLAUSES = re.compile(r"(?<=[.?!;])\s+|,?\s+(?:and then|and also|then|also|and)\s+", re.I)


class Clauses:
    name = "clauses"

    async def retrieve(self, ctx: Context) -> Discovery:
        parts = [p.strip(" ,.;") for p in _CLAUSES.split(ctx.text)]
        texts = [p for p in parts if len(p.split()) >= 3] or [ctx.text]
        found = await ctx.search(texts)
        return Discovery(found.merged.ids, found.merged.scores, trace={"clauses": texts})
