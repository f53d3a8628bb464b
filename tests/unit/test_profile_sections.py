"""Model profiles in sections: the tables a file is written in, the flat layout that still loads (one migration,
a note once per file), the one way to change a profile, meta.json's saved shape, and cache keys that did not move."""

from __future__ import annotations

import dataclasses
import json
import logging
import tomllib
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from evaluator.cli.main import main
from evaluator.core.errors import ConfigError
from evaluator.core.paths import MODELS_DIR
from evaluator.llm import LLMEngine, available_profiles, catalog, load_profile, revised
from evaluator.llm.profiles import FLAT, SECTIONS, ModelProfile, is_flat, overridden, sectioned
from evaluator.results.schema import ModelInfo, plain
from evaluator.settings.invocation import ProfileOverrides

FLAT_FILES = Path(__file__).parents[1] / "fixtures" / "profiles"
KEYS = {"GEMINI_API_KEY": "k", "OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
MSG = [{"role": "system", "content": "You are the planning step."},
       {"role": "user", "content": "User request:\nweather in Paris"}]
SCHEMA = {"name": "plan", "schema": {"type": "object", "properties": {"apis": {"type": "array"}}}, "strict": True}
# The keys of three fixed requests per profile (run 2; run 1 with a schema; a request file's body), as the
# flat ModelProfile made them (main 3c96105): a key that changes makes every user's cache cold.
KEYS_BEFORE = {
    "sim": ("74b9e281d14b19017bfc92753b1923cc324d390436f9fedf89e9816c4ca47b64",
            "52fe0e721ee4c892c3de147ee9d25152d333ff6478cbf0076f52e04f1c13fedd",
            "body-e8f8304e6d122472c2888aeb052fff4ed063388c73485b10b5e407eb59bd4d36"),
    "gemini": ("da14720a2a06110bc3472c14d25af1c1267b25ec0ab59467d686f621e7543f9c",
               "dc355f96ceda55bb57bd30811bc61e476ff520280bf1c132f384632c5c02347f",
               "body-f72424622ea4945e5063a5cd14a08ed1319b78a8d91bf1c06fa1477c28eaadd8"),
    "openai/gpt-5": ("bec59e1c57e7b2f61fd4df456fd1b4a0bde986f1c60f72886da3cb1cf93d75ab",
                     "e5a832fff50f9f4e141f5841c1c46a033b4c206970ac47b8a20f3ce5bac5e112",
                     "body-700c504229c331e71bbbca5f882f2c9fe38547268332b444d294b8041658b113"),
    "anthropic/claude-sonnet-4-5": ("e1017ccc7b512195440bb3e6d6d2f63f6fd0c7088d8440b259ee48eb40e640ef",
                                    "0444aed80f4e38f447dffaaf0300b290df8d9823e4dae7fb1e8b9dd70d4d7e78",
                                    "body-b63aedc0bd7f637bb73c8f14a92b814a947f43fcfe4cd207eb7361d531840999"),
    "qwen2.5-coder-0.5b": ("0e23e34fa5fdb07bea7a5f98d45e0e30dc657f8f621e02766d8e7d36446f9a1d",
                           "bab6080485ceac61a3b64620b87e2bbd776b6ed41c703aa7e1f2ad6f4b742b95",
                           "body-e723def077067ae2c8c2614e10605edbbf1008512f555570e184ff09b20d4f97"),
    "local": ("81cfea77eba348bd904adfa2d72e2a6ed4ab8e8e01c33d6b2edad01b27978ac4",
              "90f4fc2ad4729e9b57caa6c6c9c78b76d8f991fc4ab6dbe1a61e8ca0010d8cb0",
              "body-f06665ff12d42049687614001ddea103bbf1e94b1844df5c6e77df017f030986"),
}


def _notes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "flat layout" in r.getMessage()]


@pytest.mark.parametrize("name", sorted(KEYS_BEFORE))
def test_the_cache_key_of_a_fixed_request_is_what_the_flat_profile_made(name):
    p = load_profile(name, env=KEYS)
    e = LLMEngine(p, api_key="k")
    keys = (e.prepare(MSG, run=2, prompt_version="planner-v1").key,
            e.prepare(MSG, run=1, prompt_version="discovery-v1", schema=SCHEMA).key,
            e.prepare_body({"model": p.model, "messages": MSG}).key)
    assert keys == KEYS_BEFORE[name]


def test_every_field_of_every_section_is_documented_and_named_flat_once():
    for cls in (ModelProfile, *SECTIONS.values()):
        for name, info in cls.__pydantic_fields__.items():  # type: ignore[attr-defined]
            assert info.description and info.description.strip(), f"{cls.__name__}.{name} has no docstring"
    fields = {("", "name"), ("", "model")} | {(s, f) for s, cls in SECTIONS.items()
                                              for f in cls.__pydantic_fields__}  # type: ignore[attr-defined]
    assert sorted(FLAT.values()) == sorted(fields)  # every field has one flat name, and each names one field
    assert list(SECTIONS) == [f.name for f in dataclasses.fields(ModelProfile)][2:]


def test_the_bundled_profiles_are_written_in_sections_and_load_without_a_note(caplog):
    for name in available_profiles():
        raw = tomllib.loads((MODELS_DIR / f"{name}.toml").read_text(encoding="utf-8"))
        assert not is_flat(raw), name
        assert set(raw) <= {"name", "model", "model_env", *SECTIONS}, name
        load_profile(name, env=KEYS, require_key=False)
    assert _notes(caplog) == []


@pytest.mark.parametrize("name", ["sim", "gemini", "qwen2.5-coder-0.5b"])
def test_a_flat_file_loads_as_its_sectioned_form_with_one_note(tmp_path, caplog, name):
    flat = tmp_path / f"{name}.toml"  # the file as a user kept it from before the sections
    flat.write_text((FLAT_FILES / f"flat-{name}.toml").read_text(encoding="utf-8"), encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="evaluator.llm")
    old = load_profile(str(flat), env=KEYS)
    assert old == load_profile(name, env=KEYS)
    load_profile(str(flat), env=KEYS)  # the same file again: no second note
    notes = _notes(caplog)
    assert len(notes) == 1 and str(flat) in notes[0] and "still loads" in notes[0]
    assert str(MODELS_DIR / f"{name}.toml") in notes[0]  # where the sectioned form of it is


def test_the_flat_layout_note_reaches_the_terminal_once(tmp_path, capsys):
    flat = tmp_path / "mine.toml"
    flat.write_text('model = "m"\nbase_url = "http://127.0.0.1:9/v1"\nrpm = 60\n[extra_body]\ntop_k = 5\n')
    reqs = tmp_path / "in.jsonl"
    reqs.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"messages": MSG}}) + "\n")
    assert main(["requests", "run", str(reqs), "--model", str(flat), "--out", str(tmp_path / "out.jsonl"),
                 "--cache-dir", str(tmp_path / "cache"), "--dry-run", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("uses the flat layout") == 1 and "warning: profile" in err and str(flat) in err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[pacing]\nconcurrency = "8"\n', '[pacing] concurrency = "8" is a string; expected an integer'),
        ("[sampling]\ntemperature = 7.0\n", "[sampling] temperature = 7.0 is impossible; it must be between 0 and 2"),
        ('[batch]\napi = "azure"\n', "[batch] api = \"azure\" is impossible"),
        ("[pacing]\nrpmm = 3\n", "[pacing] has unknown key(s) ['rpmm']"),
        ("pacing = 5\n", "pacing = must be a table [pacing]"),
        ("rpm = 5\n[pacing]\nrpm = 6\n", "rpm is given twice: at the top (the flat layout) and as [pacing] rpm"),
        ("[sampling.extra_body]\nseed = 3\n", "[sampling.extra_body] may not set seed"),
        ("base_url_env = 5\n", "[connection] base_url_env = 5 is an integer; expected a string"),
        ("[prompt]\nmodel_env = 5\n", "[prompt] has unknown key(s) ['model_env']"),
    ],
)
def test_a_sectioned_file_s_mistake_names_its_table_and_key(tmp_path, text, says):
    f = tmp_path / "mine.toml"
    f.write_text(f'model = "m"\n[connection]\nbase_url = "http://127.0.0.1:5/v1"\n\n{text}'
                 if not text.startswith(("rpm", "pacing")) else f'model = "m"\n{text}\n[connection]\nbase_url = "http://h/v1"\n')
    with pytest.raises(ConfigError) as e:
        load_profile(str(f), env={})
    assert str(e.value).startswith(str(f)) and says in str(e.value) and "\n" not in str(e.value)


def test_a_sectioned_file_naming_a_provider_overrides_it_table_by_table(tmp_path):
    f = tmp_path / "claude-fast.toml"
    f.write_text('model = "claude-haiku-4-5"\n[connection]\nprovider = "anthropic"\n[pacing]\nrpm = 4000\n'
                 "[prices]\ninput_per_mtok = 0.9\n")
    p = load_profile(str(f), require_key=False, env={})
    base = load_profile("anthropic/claude-haiku-4-5", require_key=False, env={})
    assert (p.pacing.rpm, p.prices.input_per_mtok) == (4000, 0.9)
    # the rest of each table is still the provider's
    assert (p.pacing.tpm, p.prices.output_per_mtok, p.connection.wire) == (
        base.pacing.tpm, base.prices.output_per_mtok, "anthropic")


def test_the_provider_table_gives_the_profile_s_sections():
    for name, provider in catalog.providers().items():
        for model in [*list(provider.models)[:2], "some-model"]:
            fields = catalog.profile_fields(provider, model, f"{name}/{model}")
            assert set(fields) <= {"name", "model", *SECTIONS}
            for section, values in fields.items():
                if section in SECTIONS:  # every key one of its section's (base_url_env: the loader's)
                    assert set(values) - {"base_url_env"} <= set(SECTIONS[section].__pydantic_fields__), (name, section)


def test_revised_is_checked_and_leaves_the_original_alone():
    p = load_profile("sim", env={})
    q = revised(p, rpm=60, base_url="http://127.0.0.1:9/v1/", price_input_per_mtok=1.0, batch="gemini")
    assert (q.pacing.rpm, q.connection.base_url, q.prices.input_per_mtok, q.batch.api) == (
        60, "http://127.0.0.1:9/v1", 1.0, "gemini")
    assert p.pacing.rpm is None and p.connection.base_url == "" and p.batch.api == "openai"
    with pytest.raises(ConfigError, match=r"^command line: rpm = -1 is impossible"):
        revised(p, "command line: ", rpm=-1)
    with pytest.raises(ValueError, match="no profile field named"):
        revised(p, rpmm=1)


def test_command_line_overrides_are_applied_in_one_place():
    p = load_profile("anthropic/claude-haiku-4-5", require_key=False, env={})
    assert p.pacing.follow_rate_headers
    o = ProfileOverrides.given_in({"rpm": 10.0, "timeout_s": 5.0, "max_tokens": None, "unrelated": 1})
    assert o.as_kwargs() == {"rpm": 10.0, "timeout_s": 5.0}
    q = overridden(p, o.as_kwargs())
    assert (q.pacing.rpm, q.connection.timeout_s, q.pacing.follow_rate_headers) == (10.0, 5.0, False)
    assert overridden(p, {}) is p and overridden(p, {"rpm": None}) is p
    assert load_profile("anthropic/claude-haiku-4-5", require_key=False, env={}, **o.as_kwargs()) == q
    with pytest.raises(ConfigError, match="unknown model profile setting"):
        overridden(p, {"nope": 1})


def test_meta_json_saves_the_profile_flat_as_before_and_reads_it_back():
    p = revised(load_profile("gemini", env=KEYS), context_tokens=1000, server_slots=2)
    saved = plain(ModelInfo("gemini", p.model, False, p))["profile"]
    assert list(saved) == list(FLAT)  # the flat names, in the order meta.json has always had them
    assert saved["rpm"] == 1000 and saved["price_input_per_mtok"] == 0.30 and saved["batch"] == "gemini"
    assert saved == json.loads(json.dumps(p.request_settings()))
    back = TypeAdapter(ModelInfo).validate_python({"name": "gemini", "profile": saved})
    assert back.profile == p
    # a meta.json of an older release: fewer keys (no deterministic, no server_*), still read
    old = {k: v for k, v in saved.items() if not k.startswith("server_") and k != "deterministic"}
    assert TypeAdapter(ModelInfo).validate_python({"name": "gemini", "profile": old}).profile.server.ctx == 4096


def test_sectioned_moves_each_flat_key_and_keeps_sections():
    raw = {"model": "m", "rpm": 5, "batch": "openai", "price_input_per_mtok": 1.0, "base_url_env": "X",
           "extra_body": {"top_k": 1}, "sampling": {"temperature": 0.5}}
    assert is_flat(raw) and not is_flat({"model": "m", "batch": {"api": "openai"}})
    assert sectioned(raw) == {"model": "m", "pacing": {"rpm": 5}, "batch": {"api": "openai"},
                              "prices": {"input_per_mtok": 1.0}, "connection": {"base_url_env": "X"},
                              "sampling": {"temperature": 0.5, "extra_body": {"top_k": 1}}}
