"""The simulator's heuristic replies: deterministic per seed, varied across seeds, always parseable."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import orjson
import pytest
from helpers import REPO
from helpers import llm as F

from evaluator.study import prompts
from evaluator.study.parse import parse_plan, parse_stubs
from simulator import behaviour
from simulator.behaviour import answer

DATA = Path(os.environ.get("TOOLBENCH_DIR", REPO.parent / "shared" / "toolbench"))
SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")


@pytest.fixture(scope="module")
def queries() -> dict[str, list[dict]]:
    if not (DATA / "queries").is_dir():
        pytest.skip(f"ToolBench queries not found under {DATA}")
    return {g: json.loads((DATA / "queries" / f"{g}_instruction.json").read_text()) for g in ("G1", "G2", "G3")}


@pytest.fixture(scope="module")
def sample(queries: dict[str, list[dict]]) -> list[dict]:
    return [q for g in ("G1", "G2", "G3") for q in queries[g][::8]]


def _offered(q: dict) -> tuple[list[tuple[str, str | None]], list[tuple[str, str]]]:
    """(the planner prompt's (display, description) lines, the (id, display) pairs offered)."""
    apis = [(a["tool_name"], a["api_name"], a["api_description"]) for a in q["api_list"]]
    return _shown(apis), [(f"{t}::{a}", f"{t}/{a}") for t, a, _ in apis]


def _shown(apis: list[tuple[str, str, str | None]]) -> list[tuple[str, str | None]]:
    return [(f"{t}/{a}", d) for t, a, d in apis]


def _stubs(query: str, seed: int) -> list:
    stubs, err = parse_stubs(answer(prompts.discovery_messages(query), seed=seed, temperature=0.0))
    assert err is None
    return stubs


def test_docstring_says_it_is_not_a_model() -> None:
    assert "heuristic stand-in" in (behaviour.__doc__ or "")


def test_deterministic_per_seed_and_varied_across_seeds(sample: list[dict]) -> None:
    differ = 0
    for q in sample:
        msgs = prompts.discovery_messages(q["query"])
        assert answer(msgs, seed=1, temperature=0.0) == answer(list(msgs), seed=1, temperature=0.0)
        differ += len({answer(msgs, seed=s, temperature=0.0) for s in range(4)}) > 1
    assert differ >= 0.5 * len(sample)


def test_multi_clause_g2_query_gives_several_stubs(queries: dict[str, list[dict]]) -> None:
    q = next(q for q in queries["G2"] if q["query_id"] == 1643)  # a word puzzle + ZIP-code income
    for seed in range(4):
        stubs = _stubs(q["query"], seed)
        assert len(stubs) >= 2
        assert all(SNAKE.match(s.name) for s in stubs)


def test_chit_chat_is_not_a_need() -> None:
    query = (
        "I'm a football enthusiast and I want to know more about Lionel Messi's career. Can you provide me "
        "with information about Messi's clubs? Thank you for your help!"
    )
    for seed in range(8):
        stubs = _stubs(query, seed)
        assert 1 <= len(stubs) <= 5
        text = " ".join(s.reasoning for s in stubs).lower()
        assert "football enthusiast" not in text and "thank you" not in text


def test_stub_names_are_verbs_plus_nouns_and_sometimes_drop_proper_nouns() -> None:
    query = "Can you fetch the transfer history of Lionel Messi?"
    names = [_stubs(query, seed)[0].name for seed in range(16)]
    assert all(SNAKE.match(n) and n.split("_")[0] in {"get", "fetch", "retrieve"} for n in names)
    assert any("messi" not in n and "lionel" not in n for n in names)  # generic stubs happen


def test_stub_counts_stay_within_bounds(sample: list[dict]) -> None:
    for q in sample:
        for seed in range(4):
            stubs = _stubs(q["query"], seed)
            assert 1 <= len(stubs) <= 5
            assert all(SNAKE.match(s.name) and s.reasoning for s in stubs)


def test_planner_selects_offered_apis_that_fit_the_request() -> None:
    apis = [
        ("Weather API", "get forecast", "Weather forecast for a city"),
        ("Cat Facts", "random fact", "A random fact about cats"),
        ("Stock Quotes", "get quote", "Latest price of a stock ticker"),
    ]
    offered = [(f"{t}::{a}", f"{t}/{a}") for t, a, _ in apis]
    msgs = prompts.planner_messages("What is the weather forecast for Paris tomorrow?", _shown(apis))
    for seed in range(8):
        plan = parse_plan(answer(msgs, seed=seed, temperature=0.0), offered)
        assert plan.parse_error is None
        assert plan.selected[:1] == ["Weather API::get forecast"]
        assert "Cat Facts::random fact" not in plan.selected
        assert 2 <= len(plan.steps) <= 6


def test_planner_refuses_or_picks_a_wrong_tool_when_nothing_fits() -> None:
    apis = [("Cat Facts", "random fact", "A random fact about cats"), ("Dog API", "breeds", "List dog breeds")]
    offered = [(f"{t}::{a}", f"{t}/{a}") for t, a, _ in apis]
    outcomes = set()
    for seed in range(40):
        msgs = prompts.planner_messages("Convert 100 US dollars to euros, list fact about dogs.", _shown(apis))
        plan = parse_plan(answer(msgs, seed=seed, temperature=0.0), offered)
        outcomes.add("picked" if plan.selected else "refused")
        none = parse_plan(answer(prompts.planner_messages("Book a flight to Rome", _shown(apis)), seed=seed, temperature=0.0), offered)
        outcomes.add("picked" if none.selected else "refused")
    assert outcomes == {"refused", "picked"}


def test_planner_is_mostly_faithful_on_real_queries(sample: list[dict]) -> None:
    named = faithful = 0
    for q in sample:
        apis, offered = _offered(q)
        ids = {i for i, _ in offered}
        for seed in range(4):
            plan = parse_plan(answer(prompts.planner_messages(q["query"], apis), seed=seed, temperature=0.0), offered)
            named += len(plan.selected)
            faithful += sum(s in ids for s in plan.selected)
    assert named and faithful / named >= 0.95


def test_every_reply_parses_on_real_queries(sample: list[dict]) -> None:
    dressed = 0
    for q in sample:
        apis, offered = _offered(q)
        for seed in range(4):
            for msgs in (prompts.discovery_messages(q["query"]), prompts.planner_messages(q["query"], apis)):
                text = answer(msgs, seed=seed, temperature=0.7)
                dressed += not text.lstrip().startswith(("[", "{"))
                if msgs[0]["content"].startswith(prompts.DISCOVERY_MARKER):
                    stubs, err = parse_stubs(text)
                    assert err is None and stubs, text
                else:
                    plan = parse_plan(text, offered)
                    assert plan.parse_error is None, text
    assert dressed > 0  # fences and prose do occur, so the parser's tolerance is exercised


def test_other_prompts_get_a_short_generic_reply() -> None:
    reply = answer([{"role": "user", "content": "Hello there"}], seed=0, temperature=0.0)
    assert reply and len(reply) < 200 and not reply.startswith(("[", "{"))


# Its speed (CPU per reply) is measured by bench/overhead.py, not asserted here.


# --- reply knobs (server flags --p-stray, --p-runaway, --cut-at-max-tokens) ------------------------


def test_knobs_off_reply_is_the_plain_answer(sample: list[dict]) -> None:
    for q in sample[:10]:
        msgs = prompts.discovery_messages(q["query"])
        assert behaviour.reply(msgs, seed=3, temperature=0.0) == (answer(msgs, seed=3, temperature=0.0), "stop")


def test_stray_lists_in_prose_and_code_change_no_parsed_answer(sample: list[dict]) -> None:
    """Every reply carries stray lists; a strict parser reads exactly the clean reply's answer."""
    wrong_stubs = wrong_plans = 0
    for q in sample:
        apis, offered = _offered(q)
        for seed in range(2):
            d = prompts.discovery_messages(q["query"])
            noisy, finish = behaviour.reply(d, seed=seed, temperature=0.0, p_stray=1.0)
            assert finish == "stop" and 'params["origin"]' in noisy and '"Paris"' in noisy
            wrong_stubs += parse_stubs(noisy)[0] != parse_stubs(answer(d, seed=seed, temperature=0.0))[0]
            p = prompts.planner_messages(q["query"], apis)
            noisy, _ = behaviour.reply(p, seed=seed, temperature=0.0, p_stray=1.0)
            clean = parse_plan(answer(p, seed=seed, temperature=0.0), offered)
            got = parse_plan(noisy, offered)
            wrong_plans += (got.selected, got.steps) != (clean.selected, clean.steps)
    assert (wrong_stubs, wrong_plans) == (0, 0)


def test_runaway_reply_is_cut_at_max_tokens_and_keeps_its_complete_stubs() -> None:
    msgs = prompts.discovery_messages("Get the weather forecast for Paris and find hotels there.")
    text, finish = behaviour.reply(msgs, seed=0, temperature=0.0, p_runaway=1.0, max_tokens=200, cut_at_max_tokens=True)
    assert finish == "length" and len(text) == 800
    stubs, err = parse_stubs(text)
    assert err is None and len(stubs) >= 3 and stubs[0].rule.startswith("reply/truncated")
    # without the cut the runaway goes on far past the limit
    long, finish = behaviour.reply(msgs, seed=0, temperature=0.0, p_runaway=1.0, max_tokens=200)
    assert finish == "stop" and len(long) > 10_000


def test_runaway_plan_cut_before_its_selection_is_a_parse_error() -> None:
    apis = [("Weather API", "get forecast", "Weather forecast for a city")]
    msgs = prompts.planner_messages("What is the weather forecast for Paris?", _shown(apis))
    text, finish = behaviour.reply(msgs, seed=0, temperature=0.0, p_runaway=1.0, max_tokens=300, cut_at_max_tokens=True)
    plan = parse_plan(text, [("Weather API::get forecast", "Weather API/get forecast")])
    assert finish == "length" and plan.parse_error and plan.steps


def test_structured_replies_are_bare_json_in_the_schemas_shape(sample: list[dict]) -> None:
    fmt = {"type": "json_schema", "json_schema": prompts.DISCOVERY_SCHEMA}
    for q in sample[:20]:
        text, _ = behaviour.reply(prompts.discovery_messages(q["query"]), seed=1, temperature=0.0,
                                  response_format=fmt, p_stray=1.0)
        value = json.loads(text)
        assert set(value) == {"stubs"} and all(set(s) == {"name", "reasoning"} for s in value["stubs"])
        apis, _ = _offered(q)
        text, _ = behaviour.reply(prompts.planner_messages(q["query"], apis), seed=1, temperature=0.0,
                                  response_format={"type": "json_object"})
        assert set(json.loads(text)) == {"steps", "selected_apis"}


async def test_latency_per_token_makes_long_replies_slow(clock) -> None:
    # the server's own handler in this process, on the virtual clock: the wait is exactly what it charges
    sim = F.LocalSim(latency_per_token_s=0.01)
    body = orjson.dumps({"model": "sim-1", "messages": F.msgs(0), "seed": 1, "temperature": 0})
    t0 = clock.now()
    status, _, raw = await sim.handle("POST", sim.base_url + "/chat/completions", {}, body)
    took = clock.now() - t0
    assert status == 200 and took == pytest.approx(0.01 * orjson.loads(raw)["usage"]["completion_tokens"])
