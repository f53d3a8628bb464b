"""Discovery and planner prompts, written for this project, and the chat messages built from them.

Each prompt carries a version string that enters the response-cache key, so editing a prompt
invalidates exactly the replies that depended on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from evaluator.data.model import prompt_description

# The simulator recognises the prompts by these opening words; keep them stable.
DISCOVERY_MARKER = "You are the tool-discovery step of an LLM agent."
PLANNER_MARKER = "You are the planning step of an LLM agent."
HYDE_MARKER = "You are the API-documentation writer of an LLM agent's tool search."
REWRITE_MARKER = "You are the query-rewriting step of an LLM agent's tool search."

DISCOVERY_VERSION = "discovery-v1"
PLANNER_VERSION = "planner-v1"
HYDE_VERSION = "hyde-v1"  # architecture `hyde` (study/archs/hyde.py)
REWRITE_VERSION = "rewrite-v1"  # architecture `rewrite` (study/archs/rewrite.py)

DISCOVERY_SYSTEM = f"""{DISCOVERY_MARKER}
You do not know which tools exist. Read the user's request and imagine the API functions an agent
would need to fulfil it: one function per distinct sub-need, named as a developer would name it.

Answer with JSON only, no prose: a list of objects, each with
  "name": a hypothetical snake_case function name (for example "get_weather_forecast"),
  "reasoning": one sentence on what the function does and which part of the request it serves.
Return between 1 and 5 stubs. Example:
[{{"name": "search_flights", "reasoning": "Find flights between two cities on a date."}}]"""

# The examples the hyde and rewrite prompts show: a reply that repeats one for a request that has nothing to do
# with it copies the prompt (parse.py flags it, as it flags PtR's copied example stubs).
HYDE_EXAMPLE = "Weather/forecast by city"
REWRITE_EXAMPLE = "get weather forecast for a city and date"
EXAMPLE_TOPIC = ("weather", "forecast", "rain")  # a request with one of these words may mean the example

# hyde (hypothetical documents, the HyDE idea for tools as in ToolDreamer): per sub-need, the documentation
# entry an API serving it would have; each entry's "name: description" is searched as a PtR stub is.
HYDE_SYSTEM = f"""{HYDE_MARKER}
You do not know which APIs exist. Read the user's request and, for each distinct sub-need, write the
documentation entry of an API that would serve it, as it would appear in an API registry.

Answer with JSON only, no prose: a list of objects, each with
  "name": the API's name as a registry lists it (for example "{HYDE_EXAMPLE}"),
  "description": one short paragraph of documentation: what the API returns and from which inputs.
Write between 1 and 5 entries."""

# rewrite (zero-shot query rewriting, TOOLQP's idea without its training): one retrieval query in the
# vocabulary of API documentation, searched as RtP's raw query is.
REWRITE_SYSTEM = f"""{REWRITE_MARKER}
Rewrite the user's request into one search query for a registry of API documentation: name the
functionality the APIs must offer in the words API descriptions use (nouns and verbs such as "get",
"search", "convert"), leave out names, numbers and courtesy.

Answer with JSON only, no prose, e.g. for "Will it rain in Lyon on Saturday?":
{{"query": "{REWRITE_EXAMPLE}"}}"""

PLANNER_SYSTEM = f"""{PLANNER_MARKER}
You are given the user's request and a list of available APIs retrieved from a large registry.
Plan how to fulfil the request using ONLY the listed APIs. Some listed APIs may be irrelevant: ignore
them. If none of them helps, select none.

Answer with JSON only, no prose:
{{"steps": ["short imperative step", ...],
  "selected_apis": ["Tool name/API name", ...]}}
Copy each selected API exactly as it is written in the list (the part before the colon).
Use an empty "selected_apis" list if no listed API can help."""

# Names the discovery prompt itself shows as examples, with the example's reasoning where it gives
# one. A stub that repeats one of them is a copy of the prompt, not the model's reading of the
# request; the parser flags it (see parse.py) and Match% leaves it out.
DISCOVERY_EXAMPLES: tuple[tuple[str, str | None], ...] = (
    ("search_flights", "Find flights between two cities on a date."),
    ("get_weather_forecast", None),
)

# JSON schemas for structured outputs (`response_format`), one per prompt, in the shape
# {"name": ..., "schema": ...} that OpenAI's json_schema mode takes. Providers want an object at the
# top level, so discovery's list of stubs is wrapped as {"stubs": [...]}; the parser reads both the
# wrapped and the bare-list form. Every property is required and no other is allowed, as OpenAI's
# strict mode demands; llama.cpp, vLLM and SGLang turn the same schema into a grammar. The API
# names stay free strings (no enum of the offered APIs): whether a planner copies a name faithfully
# is part of what the study measures.
DISCOVERY_SCHEMA: dict = {
    "name": "discovery_stubs",
    "schema": {
        "type": "object",
        "properties": {
            "stubs": {
                "type": "array",
                "minItems": 1,
                "maxItems": 5,
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "reasoning": {"type": "string"}},
                    "required": ["name", "reasoning"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["stubs"],
        "additionalProperties": False,
    },
}

PLANNER_SCHEMA: dict = {
    "name": "planner_plan",
    "schema": {
        "type": "object",
        "properties": {
            "steps": {"type": "array", "maxItems": 10, "items": {"type": "string"}},
            "selected_apis": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["steps", "selected_apis"],
        "additionalProperties": False,
    },
}


HYDE_SCHEMA: dict = {
    "name": "hyde_documents",
    "schema": {
        "type": "object",
        "properties": {
            "entries": {
                "type": "array",
                "minItems": 1,
                "maxItems": 5,
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
                    "required": ["name", "description"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["entries"],
        "additionalProperties": False,
    },
}

REWRITE_SCHEMA: dict = {
    "name": "rewritten_query",
    "schema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    },
}


def hyde_messages(query: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": HYDE_SYSTEM},
        {"role": "user", "content": f"User request:\n{query}"},
    ]


def rewrite_messages(query: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": REWRITE_SYSTEM},
        {"role": "user", "content": f"User request:\n{query}"},
    ]


def discovery_messages(query: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": DISCOVERY_SYSTEM},
        {"role": "user", "content": f"User request:\n{query}"},
    ]


def api_line(display: str, description: str | None) -> str:
    # One line per API: a description's own newlines would read as further list entries. An oversized
    # description is cut at DESCRIPTION_CAP_TOKENS (counted as a data warning when the registry loads).
    return f"- {display}: {prompt_description(description)[0]}"


def planner_messages(query: str, apis: Sequence[tuple[str, str | None]]) -> list[dict[str, str]]:
    """`apis` are (display, description) of the retrieved set, best first: `Api.display` names an API as
    `{tool_name}/{api_name}` (a corpus document by its id)."""
    listing = "\n".join(api_line(n, d) for n, d in apis) if apis else "(none)"
    user = f"User request:\n{query}\n\nAvailable APIs:\n{listing}"
    return [
        {"role": "system", "content": PLANNER_SYSTEM},
        {"role": "user", "content": user},
    ]
