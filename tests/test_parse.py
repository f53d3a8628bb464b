"""Parsing of discovery and planner replies as real models write them."""

from __future__ import annotations

from evaluator.parse import Plan, Stub, parse_plan, parse_stubs, stub_text

OFFERED = [
    ("Weather API::get forecast", "Weather API/get forecast"),
    ("Weather API::get history", "Weather API/get history"),
    ("Kick.com API | Kick API::Get Channel Clips", "Kick.com API | Kick API/Get Channel Clips"),
    ("Kick.com API | Kick API::Get Channel Links", "Kick.com API | Kick API/Get Channel Links"),
    ("Youtube Videos::/mp4", "Youtube Videos//mp4"),
    ("Photo Bear::Remove Background: set background to white", "Photo Bear/Remove Background: set background to white"),
    ("Other Tool::get history", "Other Tool/get history"),
]


def _plan(text: str | None, lookup=None) -> Plan:
    return parse_plan(text, OFFERED, lookup)


# --- stubs -----------------------------------------------------------------------------------


def test_stub_text_is_the_retrieval_text() -> None:
    assert stub_text(Stub("get_weather", "Forecast for Paris.")) == "get_weather: Forecast for Paris."


def test_fenced_prose_wrapped_reply_with_trailing_commas() -> None:
    text = (
        "Sure! Here are the stubs:\n```json\n[\n"
        '  {"name": "get_player_transfers", "reasoning": "Transfers of Messi.",},\n'
        '  {"name": "search_concert_events", "reasoning": "Concerts nearby."},\n]\n```\nHope this helps!'
    )
    stubs, err = parse_stubs(text)
    assert err is None
    assert stubs == [
        Stub("get_player_transfers", "Transfers of Messi."),
        Stub("search_concert_events", "Concerts nearby."),
    ]


def test_single_quotes_and_python_literals() -> None:
    stubs, err = parse_stubs("[{'name': 'get_x', 'reasoning': \"Messi's clubs\", 'optional': None}]")
    assert err is None and stubs == [Stub("get_x", "Messi's clubs")]


def test_truncated_list_recovers_complete_objects() -> None:
    text = '[{"name": "a_b", "reasoning": "x"}, {"name": "c_d", "reasoning": "y"}, {"name": "e_f", "reas'
    stubs, err = parse_stubs(text)
    assert err is None
    assert [s.name for s in stubs] == ["a_b", "c_d"]


def test_wrapper_dicts_and_alternative_keys() -> None:
    text = (
        '{"stubs": [{"function": "f_one", "description": "d1"}, {"tool_name": "f_two", "reason": "r2"},'
        ' {"reasoning": "nameless"}]}'
    )
    stubs, err = parse_stubs(text)
    assert err is None and stubs == [Stub("f_one", "d1"), Stub("f_two", "r2")]
    stubs, _ = parse_stubs('{"tools": [{"type": "function", "function": {"name": "g", "description": "e"}}]}')
    assert stubs == [Stub("g", "e")]


def test_duplicates_are_dropped() -> None:
    stubs, _ = parse_stubs('[{"name": "a", "reasoning": "x"}, {"name": "a", "reasoning": "x"}, {"name": "a", "reasoning": "z"}]')
    assert stubs == [Stub("a", "x"), Stub("a", "z")]


def test_brackets_in_prose_do_not_hide_the_answer() -> None:
    stubs, err = parse_stubs('As noted [see above] and [1], here: [{"name": "z_y", "reasoning": "q"}]')
    assert err is None and stubs == [Stub("z_y", "q")]


def test_unparseable_and_empty_replies_report_an_error() -> None:
    for text in (None, "", "   ", "I cannot help with that.", '[{"name": "x", "reas'):
        stubs, err = parse_stubs(text)
        assert stubs == [] and err


def test_explicit_empty_list_is_not_an_error() -> None:
    assert parse_stubs("[]") == ([], None)


# --- plans -----------------------------------------------------------------------------------


def test_case_and_spacing_variants_map_to_offered_ids() -> None:
    plan = _plan('{"steps": ["look"], "selected_apis": ["weather api/Get Forecast", "Weather API / get history "]}')
    assert plan.selected == ["Weather API::get forecast", "Weather API::get history"]
    assert plan.refused is False and plan.parse_error is None and plan.steps == ["look"]


def test_bullets_numbering_quotes_and_copied_descriptions() -> None:
    plan = _plan(
        '{"steps": [], "selected_apis": ["- `Youtube Videos//mp4`", "1. Kick.com API | Kick API/Get Channel Clips",'
        ' "Weather API/get forecast: returns the forecast"]}'
    )
    assert plan.selected == [
        "Youtube Videos::/mp4",
        "Kick.com API | Kick API::Get Channel Clips",
        "Weather API::get forecast",
    ]


def test_names_holding_colons_are_matched_whole() -> None:
    plan = _plan('{"selected_apis": ["Photo Bear/Remove Background: set background to white"]}')
    assert plan.selected == ["Photo Bear::Remove Background: set background to white"]


def test_api_name_alone_matches_only_when_unambiguous() -> None:
    assert _plan('{"selected_apis": ["get forecast"]}').selected == ["Weather API::get forecast"]
    # "get history" exists in two tools: the bare name stays raw rather than guessing
    assert _plan('{"selected_apis": ["get history"]}').selected == ["get history"]


def test_near_miss_is_fuzzy_matched_but_not_when_equally_close_to_two() -> None:
    assert _plan('{"selected_apis": ["Kick.com API | Kick API/Get Channel Clip"]}').selected == [
        "Kick.com API | Kick API::Get Channel Clips"
    ]
    twins = [("Tool::abc1", "Tool/abc1"), ("Tool::abc2", "Tool/abc2")]
    assert parse_plan('{"selected_apis": ["Tool/abc"]}', twins).selected == ["Tool/abc"]


def test_unknown_names_use_the_registry_lookup_or_stay_raw() -> None:
    def lookup(name: str) -> str | None:
        return "Elsewhere::x" if name == "Elsewhere/x" else None

    plan = _plan('{"selected_apis": ["Elsewhere/x", "Made Up/api", "Made Up/api"]}', lookup)
    assert plan.selected == ["Elsewhere::x", "Made Up/api"]
    assert plan.refused is False


def test_duplicates_are_dropped_in_order() -> None:
    plan = _plan('{"selected_apis": ["Weather API/get history", "weather api/get forecast", "Weather API/get history"]}')
    assert plan.selected == ["Weather API::get history", "Weather API::get forecast"]


def test_step_objects_name_the_apis_when_no_list_is_given() -> None:
    text = '```json\n{"steps": [{"step": "Forecast", "api": "Weather API/get forecast"}, {"step": "Reply"}]}\n```'
    plan = _plan(text)
    assert plan.steps == ["Forecast", "Reply"]
    assert plan.selected == ["Weather API::get forecast"]


def test_alternative_selection_keys_and_fences() -> None:
    for key in ("apis", "selected", "tools"):
        plan = _plan(f'Here is the plan:\n```\n{{"steps": ["a"], "{key}": ["Weather API/get forecast"],}}\n```')
        assert plan.selected == ["Weather API::get forecast"], key


def test_empty_selection_is_a_refusal() -> None:
    plan = _plan('{"steps": ["Check the list", "Say none helps"], "selected_apis": []}')
    assert plan.refused is True and plan.parse_error is None and len(plan.steps) == 2


def test_truncated_plan_keeps_complete_selections() -> None:
    plan = _plan('{"steps": ["a", "b"], "selected_apis": ["Weather API/get forecast", "Weather API/get hi')
    assert plan.selected == ["Weather API::get forecast"] and plan.parse_error is None


def test_plan_cut_off_before_its_selection_is_flagged() -> None:
    plan = _plan('{"steps": ["a", "b"], "selected_ap')
    assert plan.steps == ["a", "b"] and plan.refused and plan.parse_error


def test_unparseable_plan_reports_an_error() -> None:
    for text in (None, "", "I would call the weather API."):
        plan = _plan(text)
        assert plan.parse_error and plan.refused and plan.selected == []
