"""The simulator answers any prompt that carries a JSON schema with JSON valid against it (checked by the
`jsonschema` library, a third party), its strings read from the request; through the engine and the server,
as a plugin's own structured call meets it. Prose or a refusal where JSON was asked is no valid result."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from helpers import llm as F

from evaluator.llm import load_profile
from evaluator.study.parse import parse_json, parse_query
from simulator.behaviour import reply, schema_instance

jsonschema = pytest.importorskip("jsonschema")

REQUEST = "Find flights from Berlin to Rome on Friday, then get the weather forecast for Rome and book a hotel there."
MESSAGES = [{"role": "system", "content": "You are a planner of my own."}, {"role": "user", "content": REQUEST}]

SCHEMAS = [
    {"type": "object", "properties": {"queries": {"type": "array", "items": {"type": "string"}}},
     "required": ["queries"], "additionalProperties": False},
    {"type": "object", "required": ["tools", "confident"], "additionalProperties": False,
     "properties": {"tools": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"$ref": "#/$defs/tool"}},
                    "confident": {"type": "boolean"}},
     "$defs": {"tool": {"type": "object", "required": ["name", "why", "weight", "rank", "kind"],
                        "additionalProperties": False,
                        "properties": {"name": {"type": "string", "minLength": 3}, "why": {"type": "string"},
                                       "weight": {"type": "number", "minimum": 0, "maximum": 1},
                                       "rank": {"type": "integer", "minimum": 1, "maximum": 9},
                                       "kind": {"enum": ["search", "read", "write"]}}}}},
    {"type": "array", "items": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 12}]}, "minItems": 1},
    {"allOf": [{"type": "object", "properties": {"a": {"const": 7}}, "required": ["a"]},
               {"properties": {"b": {"type": ["string", "null"], "format": "date"}}, "required": ["b"]}]},
    {"type": "object", "properties": {"intent": {"type": "string"},
                                      "slots": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                 "days": {"type": "integer"}},
                                                "required": ["city", "days"]}}, "required": ["intent", "slots"]},
]


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
@pytest.mark.parametrize("form", ["json_schema", "json_object_schema"])
def test_any_schema_is_answered_with_json_valid_against_it(i: int, form: str) -> None:
    schema = SCHEMAS[i]
    rf = ({"type": "json_schema", "json_schema": {"name": "mine", "schema": schema, "strict": True}}
          if form == "json_schema" else {"type": "json_object", "schema": schema})
    for seed in range(4):
        text, finish = reply(MESSAGES, seed=seed, temperature=0.0, response_format=rf)
        assert finish == "stop"
        jsonschema.validate(json.loads(text), schema)  # raises on any breach
    assert reply(MESSAGES, seed=1, temperature=0.0, response_format=rf) == \
        reply(MESSAGES, seed=1, temperature=0.0, response_format=rf)  # deterministic per seed


def test_the_strings_come_from_the_request() -> None:
    value = schema_instance(SCHEMAS[0], REQUEST, random.Random(0))
    assert isinstance(value, dict) and len(value["queries"]) >= 2  # one per need of the request
    said = " ".join(value["queries"])
    assert "flights" in said and ("weather" in said or "hotel" in said)
    named = schema_instance(SCHEMAS[1], REQUEST, random.Random(0))
    assert isinstance(named, dict) and all("_" in t["name"] or t["name"].isalpha() for t in named["tools"])


def test_without_a_schema_a_prompt_it_does_not_know_gets_prose_or_a_json_object() -> None:
    text, _ = reply(MESSAGES, seed=0, temperature=0.0)
    assert parse_json(text) == (None, "no JSON found in reply")  # prose: a plugin's parser says so
    text, _ = reply(MESSAGES, seed=0, temperature=0.0, response_format={"type": "json_object"})
    assert isinstance(json.loads(text), dict)


def test_prose_or_a_refusal_where_json_was_asked_is_no_result() -> None:
    for text in ("I'm sorry, but I can't help with that.", "get weather forecast", "Sure! Search for flights."):
        assert parse_query(text, "Will it rain in Oslo?") == ("", "no JSON found in reply")
        assert parse_json(text)[0] is None
    assert parse_query('{"query": "get weather forecast"}') == ("get weather forecast", None)
    assert parse_query('"get weather forecast"') == ("get weather forecast", None)  # a JSON string is JSON
    assert parse_json('Here it is:\n```json\n{"queries": ["a"]}\n```') == ({"queries": ["a"]}, None)


def test_a_plugins_structured_call_through_the_engine_and_the_server() -> None:
    # the server's own handlers, in this process (the socket between them: tests/integration/test_llm_transport.py)
    schema = {"name": "mine", "schema": SCHEMAS[1]}
    sim = F.LocalSim()

    async def go() -> list:
        out = []
        for structured in ("json_schema", "json_object_schema"):
            profile = load_profile("sim", base_url=sim.base_url, structured=structured)
            async with sim.engine(profile) as engine:
                r = await engine.chat(MESSAGES, run=0, prompt_version="mine-v1", schema=schema)
                out.append(r)
        return out

    results = asyncio.run(go())
    for r in results:
        assert r.error is None, r.error
        jsonschema.validate(json.loads(r.content or ""), SCHEMAS[1])
