"""Data stage: the API registry and the benchmark queries, read and validated.

Registries: the project's JSONL (ToolBench's, one API a line), ToolBench's `toolenv/tools` tree, MCP
`tools/list` results, OpenAI-style function definitions and a BEIR folder's corpus, detected from content or
forced (`registry.TOOLS_FORMATS`). Queries: ToolBench `test_instruction` files, JSONL / CSV with `query`
and `gold`, or a BEIR folder's queries with the qrels of one split (graded gold; `beir`). Every API embeds
by one rule (`EMBED_TEXT_RULE`; a corpus document: `CORPUS_TEXT_RULE`). Every file is read through `source`,
so a bad input stops the study with one line naming the file, the line or record and what was expected
(`DataError`), before any work; lesser problems are counted as warnings that reach the report; nothing
is dropped silently and nothing is half-loaded.
"""

from evaluator.data.locate import resolve_data_dir
from evaluator.data.model import (
    CORPUS_TEXT_RULE,
    EMBED_TEXT_RULE,
    GOLD_SETS,
    REGISTRY_CHOICES,
    Api,
    Query,
    QueryId,
    Registry,
    Warnings,
    api_id,
    match_subsets,
    qid_key,
)
from evaluator.data.queries import (
    find_query_files,
    load_queries,
    load_query_files,
    normalise_qid,
    select_subsets,
)
from evaluator.data.registry import TOOLS_FORMATS, load_registry

__all__ = [
    "CORPUS_TEXT_RULE", "EMBED_TEXT_RULE", "GOLD_SETS", "REGISTRY_CHOICES", "TOOLS_FORMATS", "Api", "Query", "Registry",
    "Warnings", "api_id", "find_query_files", "load_queries", "load_query_files", "load_registry", "match_subsets",
    "normalise_qid",
    "QueryId", "qid_key", "resolve_data_dir", "select_subsets",
]
