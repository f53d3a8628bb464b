"""Gold ids that match nothing, and ids told apart only by case or space, driven through the CLI as a user
runs it (issue 31, items 1 and 10): a gold id form mistake stops before any paid work with one line naming
the file, an example id and the form expected; a few unknown ids are counted warnings on stderr too."""

from __future__ import annotations

import gzip
import json

import pytest
from helpers.cli import run_cli
from helpers.data import api_records
from helpers.study import study_args, workspace

GOOD = [("Weather API", "get forecast"), ("Currency Exchange", "convert"), ("Football Data", "player transfers"),
        ("Hotels Finder", "search hotels")]
QUERIES = ["weather in Paris", "100 dollars in euros", "Messi's transfers", "a hotel in Rome"]

# Mistakes in the id form: each is made on every id of the file. (how the id is written, from tool and api)
FORMS = {
    "slash": lambda t, a: f"{t}/{a}",
    "dot": lambda t, a: f"{t}.{a}",
    "api name alone": lambda t, a: a,
    "wrong case": lambda t, a: f"{t.upper()}::{a.upper()}",
    "single colon": lambda t, a: f"{t}:{a}",
}


def _queries(path, ids):
    path.write_text("".join(json.dumps({"id": n, "query": q, "gold": [g]}) + "\n"
                            for n, (q, g) in enumerate(zip(QUERIES, ids, strict=True))), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    with workspace(tmp_path_factory.mktemp("gold")) as w:
        yield w


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_file_of_gold_ids_in_another_form_stops_before_any_call(ws, tmp_path, form):
    root, data, sim = ws
    before = sim.stats()["requests"]
    q = _queries(tmp_path / "mine.jsonl", [FORMS[form](t, a) for t, a in GOOD])
    out = tmp_path / "out"
    r = run_cli(*study_args(ws, tmp_path / "cache", out, "--queries", str(q), runs=1), cwd=root)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "mine.jsonl" in line and "tool::api" in line and "gold ids match no API" in line
    assert repr(FORMS[form](*GOOD[0])) in line  # an example id as written
    assert "'Weather API::get forecast'" in line  # ... and the id it most likely means
    assert not (out / "queries.jsonl").exists()
    assert sim.stats()["requests"] == before  # nothing sent


def test_one_query_whose_every_gold_id_is_unknown_stops(ws, tmp_path):
    root, _, _ = ws
    ids = [f"{t}::{a}" for t, a in GOOD]
    ids[2] = "Football Data::player_transfers"  # 1 of 4 ids: not most of the file, but all of query 2's gold
    q = _queries(tmp_path / "mine.jsonl", ids)
    r = run_cli(*study_args(ws, tmp_path / "cache", tmp_path / "out", "--queries", str(q), runs=1), cwd=root)
    assert r.returncode == 2, r.stderr
    assert "mine.jsonl:3" in r.stderr and "query 2" in r.stderr and "tool::api" in r.stderr
    assert "'Football Data::player transfers'" in r.stderr


def test_a_few_unknown_gold_ids_are_a_warning_on_stderr_and_in_the_report(ws, tmp_path):
    root, _, _ = ws
    q = tmp_path / "mine.jsonl"
    recs = [{"id": n, "query": text, "gold": [f"{t}::{a}"] + (["Ghost::api"] if n == 0 else [])}
            for n, (text, (t, a)) in enumerate(zip(QUERIES, GOOD, strict=True))]
    q.write_text("".join(json.dumps(x) + "\n" for x in recs), encoding="utf-8")
    out = tmp_path / "out"
    r = run_cli(*study_args(ws, tmp_path / "cache", out, "--queries", str(q), runs=1), cwd=root)
    assert r.returncode == 0, r.stderr
    assert "warning: data: 1 gold_not_in_registry_api_list" in r.stderr and "Ghost::api" in r.stderr
    assert "Ghost::api" in (out / "report.md").read_text()


def test_ids_differing_only_by_case_or_space_are_counted(tmp_path):
    data = tmp_path / "data"
    (data / "registry").mkdir(parents=True)
    recs = api_records() + [{"tool_name": "weather api", "api_name": "get forecast", "category": None,
                             "api_description": "lower-case twin"},
                            {"tool_name": "Weather API", "api_name": "get  forecast ", "category": None,
                             "api_description": "spaced twin"}]
    with gzip.open(data / "registry" / "apis.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in recs))
    q = _queries(tmp_path / "mine.jsonl", [f"{t}::{a}" for t, a in GOOD])
    out = tmp_path / "out"
    r = run_cli("--retrieval-only", "--data", str(data), "--queries", str(q), "--cache-dir", str(tmp_path / "cache"),
                "--out", str(out), "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning: data: 2 near_duplicate_api" in r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["warnings"]["near_duplicate_api"]["count"] == 2
    assert "near_duplicate_api" in (out / "report.md").read_text()
