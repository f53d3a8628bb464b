"""An example plugin with a structured prompt of its own: the model splits the request into search queries (one
per need, in the words of API documentation), each is searched, and the hits are merged by their best score.

    python -m evaluator arch check examples/arch_plugin/subqueries.py:SubQueries
    python -m evaluator --model sim --structured json_schema --runs 1 \
        --archs rtp,ptr,examples/arch_plugin/subqueries.py:SubQueries

It shows the parts of the contract a prompt-using plugin meets: `ctx.chat(..., schema=)` sends a JSON schema as
the model's profile says (the simulator answers any schema with valid JSON once it is sent: `--structured
json_schema`, which `arch check` uses); a call can fail for good (`reply.error`, never raised); a reply can be
prose where JSON was asked (`parse_json` says so); the trace keeps what the viewer should show; the call's name
("subqueries") keys its tokens in the record; and with nothing to search it returns `plan=False`, so no planner
is asked with an empty list.
"""

from __future__ import annotations

from evaluator.study.archs import Context, Discovery, parse_json

VERSION = "subqueries-v1"  # part of the response cache's key: change it when the prompt changes
SYSTEM = """You turn a user's request into search queries for a registry of API documentation.
Write one short query per distinct need of the request, in the words API descriptions use (verbs such as "get",
"search", "convert" and the nouns of the data), leaving out names, numbers and courtesy.
Answer with JSON only: {"queries": ["...", ...]}"""
SCHEMA = {"name": "subqueries", "schema": {
    "type": "object", "properties": {"queries": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                                 "maxItems": 5}},
    "required": ["queries"], "additionalProperties": False}}


class SubQueries:
    name = "subqueries"

    async def retrieve(self, ctx: Context) -> Discovery:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"User request: {ctx.text}"}]
        reply = await ctx.chat(messages, prompt_version=VERSION, schema=SCHEMA)
        value, error = parse_json(reply.content) if reply.error is None else (None, f"call failed: {reply.error}")
        queries = [q.strip() for q in (value or {}).get("queries", []) if isinstance(q, str) and q.strip()] \
            if isinstance(value, dict) else []
        if not queries and error is None:
            error = "the reply's JSON holds no queries"
        trace = {"queries": queries, "parse_error": error if not queries else None}
        if not queries:  # nothing to search: the query retrieves nothing, no planner call
            return Discovery([], plan=False, calls={"subqueries": reply}, trace=trace)
        found = await ctx.search(queries)
        return Discovery(found.merged.ids, found.merged.scores, calls={"subqueries": reply}, trace=trace)
