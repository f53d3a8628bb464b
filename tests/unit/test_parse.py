"""Parsing of discovery and planner replies as real models write them."""

from __future__ import annotations

from evaluator.study.parse import Plan, Stub, parse_plan, parse_stubs, stub_text

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
    assert plan.parse_error is None and plan.steps == ["look"]


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
    assert plan.selected == [] and plan.parse_error is None and len(plan.steps) == 2


def test_truncated_plan_keeps_complete_selections() -> None:
    plan = _plan('{"steps": ["a", "b"], "selected_apis": ["Weather API/get forecast", "Weather API/get hi')
    assert plan.selected == ["Weather API::get forecast"] and plan.parse_error is None


def test_plan_cut_off_before_its_selection_is_flagged() -> None:
    plan = _plan('{"steps": ["a", "b"], "selected_ap')
    assert plan.steps == ["a", "b"] and plan.selected == [] and plan.parse_error


def test_unparseable_plan_reports_an_error() -> None:
    for text in (None, "", "I would call the weather API."):
        plan = _plan(text)
        assert plan.parse_error and plan.selected == []


# --- strictness: noise in a reply is not an answer ----------------------------------------------
# Each reply below holds one kind of noise the issue lists; a parser that read any of it as an answer
# would show a false positive. The tests count them and require zero.

STRAY_SELECTION_REPLIES = [
    # a bare list of strings in code, no answer object at all
    'I would call it like this: `requests.get(url, params=params["origin"])`',
    '```python\nparams["origin"] = "NYC"\nfor k in ["Weather API/get forecast"]:\n    pass\n```',
    # offered names in prose are what the model looked at, not a selection
    'The candidates were ["Weather API/get forecast", "Weather API/get history"]; none fits.',
    # an answer object that selects nothing, next to stray lists
    'Checked ["Weather API/get forecast"].\n{"steps": ["Say none helps"], "selected_apis": []}\nUse params["x"].',
    'Some text [1] and ["Weather API/get history"]\n```json\n{"steps": ["a"], "selected_apis": []}\n```',
]


def test_strings_outside_the_answer_object_are_never_selections() -> None:
    false_positives = sum(bool(_plan(t).selected or _plan(t).selected_offered) for t in STRAY_SELECTION_REPLIES)
    assert false_positives == 0


def test_the_answer_object_wins_over_stray_lists_around_it() -> None:
    text = (
        'Looked at ["Weather API/get history"].\n'
        '{"steps": ["Get it"], "selected_apis": ["Weather API/get forecast"]}\n'
        '```python\nparams["origin"]\n```'
    )
    plan = _plan(text)
    assert plan.selected == ["Weather API::get forecast"]
    assert plan.source == "prose" and plan.selected_rule == "key:selected_apis"


def test_a_whole_reply_that_is_a_list_is_still_a_selection() -> None:
    plan = _plan('["Weather API/get forecast"]')
    assert plan.selected == ["Weather API::get forecast"] and plan.selected_rule == "bare list"
    plan = _plan('```json\n["Weather API/get history"]\n```')
    assert plan.selected == ["Weather API::get history"] and plan.source == "fence"


def test_only_offered_apis_count_as_a_selection() -> None:
    plan = _plan('{"steps": ["x"], "selected_apis": ["origin", "Made Up/api", "weather api/get forecast"]}')
    assert plan.selected == ["origin", "Made Up/api", "Weather API::get forecast"]  # all kept for fidelity
    assert plan.selected_offered == ["Weather API::get forecast"]
    plan = _plan('{"steps": ["x"], "selected_apis": ["origin"]}')
    assert plan.selected_offered == [] and plan.selected == ["origin"]  # named something, nothing offered


def test_every_selected_name_records_its_rule() -> None:
    def lookup(name: str) -> str | None:
        return "Elsewhere::x" if name == "Elsewhere/x" else None

    plan = _plan(
        '{"steps": ["a"], "selected_apis": ["Weather API/get forecast", "WEATHER API / get history", '
        '"Kick.com API Kick API/Get Channel Links", "get forecast", "Weather API/get forecast: the forecast", '
        '"Kick.com API | Kick API/Get Channel Clip", "Elsewhere/x", "Made Up/api"]}',
        lookup,
    )
    rules = [(s.raw, s.rule, s.offered) for s in plan.names]
    assert [r for _, r, _ in rules] == [
        "exact", "case/space", "punctuation", "api-name", "prefix:exact", "fuzzy", "registry", "unresolved",
    ]
    assert [o for _, _, o in rules] == [True] * 6 + [False, False]
    audit = plan.audit()
    assert audit.source == "reply" and audit.steps_rule == "key:steps"
    assert audit.names[-1] == ("Made Up/api", "Made Up/api", "unresolved", False)


def test_repaired_and_truncated_answers_say_so() -> None:
    assert _plan("{'steps': ['a'], 'selected_apis': ['Weather API/get forecast',]}").source == "reply/repaired"
    plan = _plan('```json\n{"steps": ["a"], "selected_apis": ["Weather API/get forecast", "Weather')
    assert plan.source == "fence/truncated" and plan.selected == ["Weather API::get forecast"]


NOT_STUB_REPLIES = [
    # lists of dicts that are not the stub list
    'Cities: [{"name": "Paris", "country": "France"}, {"name": "Lyon", "country": "France"}]',
    '{"destinations": [{"name": "Paris", "description": "Capital of France"}]}',
    '{"name": "Paris", "country": "France"}',
    'Example: {"name": "Paris", "description": "city"} and [{"title": "Rome", "why": "nice"}]',
    '```python\ncities = [{"name": "Paris", "reasoning": "x"}]\n```',
    # a list of strings in code
    'Use `params["origin"]` and ["Paris", "Rome"].',
]


def test_lists_of_dicts_that_are_not_the_stub_list_give_no_stubs() -> None:
    false_positives = [t for t in NOT_STUB_REPLIES if parse_stubs(t)[0]]
    assert false_positives == []


def test_the_stub_list_wins_over_stray_lists_in_prose() -> None:
    text = (
        'The request names [{"name": "Paris", "country": "France"}].\n'
        '[{"name": "get_weather_forecast", "reasoning": "Forecast for Paris."}]\n'
        'Call it as get_weather_forecast(params["city"]).'
    )
    stubs, err = parse_stubs(text)
    assert err is None and [s.name for s in stubs] == ["get_weather_forecast"]
    assert stubs[0].rule == "prose:list:name+reasoning"


def test_stub_rules_name_the_container_and_item_form() -> None:
    stubs, _ = parse_stubs('{"stubs": [{"name": "a_b", "reasoning": "x"}, "c_d: why", {"function": {"name": "e", "description": "f"}}]}')
    assert [s.rule for s in stubs] == [
        "reply:key stubs:name+reasoning",
        "reply:key stubs:string name:reasoning",
        "reply:key stubs:tool schema name+description",
    ]
    stubs, _ = parse_stubs("{'get_weather': 'Forecast.',}")
    assert stubs == [Stub("get_weather", "Forecast.")] and stubs[0].rule == "reply/repaired:name map:name+reasoning"


def test_structured_output_shape_is_read() -> None:
    stubs, err = parse_stubs('{"stubs": [{"name": "get_x", "reasoning": "y"}]}')
    assert err is None and stubs == [Stub("get_x", "y")]


def test_a_copy_of_the_prompts_example_is_flagged() -> None:
    copied = '[{"name": "search_flights", "reasoning": "Find flights between two cities on a date."}]'
    stubs, _ = parse_stubs(copied, query="Find me a flight to Rome")
    assert stubs[0].example_copy  # the example's own reasoning: a copy even for a flight request
    stubs, _ = parse_stubs('[{"name": "search_flights", "reasoning": "Flights to Rome."}]', query="What is the NAV of VTI?")
    assert stubs[0].example_copy  # the request has nothing to do with flights
    stubs, _ = parse_stubs('[{"name": "search_flights", "reasoning": "Flights to Rome."}]', query="Book a flight to Rome")
    assert not stubs[0].example_copy  # the model's own need
    stubs, _ = parse_stubs('[{"name": "get_weather_forecast", "reasoning": "x"}]', query="Weather in Oslo?")
    assert not stubs[0].example_copy
    stubs, _ = parse_stubs('[{"name": "get_weather_forecast", "reasoning": "x"}]', query="Stock price of IBM")
    assert stubs[0].example_copy
    assert not parse_stubs('[{"name": "get_stock_price", "reasoning": "x"}]', query="IBM")[0][0].example_copy


def test_a_reply_that_opens_with_its_answer_and_explains_it_is_read() -> None:
    stubs, err = parse_stubs('[{"name": "Weather Forecast", "reasoning": "For Paris."}]\n\nI chose this because ["x"].')
    assert err is None and stubs == [Stub("Weather Forecast", "For Paris.")] and stubs[0].rule.startswith("lead:")
    plan = _plan('{"steps": ["a"], "selected_apis": ["Weather API/get forecast"]}\nThat is all, see ["Weather API/get history"].')
    assert plan.selected == ["Weather API::get forecast"] and plan.source == "lead"
    # a leading bare list is not the answer when text follows it
    assert _plan('["Weather API/get forecast"] is what I looked at; nothing fits.').selected == []
    assert parse_stubs('[{"name": "Paris", "country": "France"}] is where you go.')[0] == []
