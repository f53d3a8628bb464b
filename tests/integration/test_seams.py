"""The plugin seam checked per query, driven as a user would: a study with plugins that misbehave on one query
(tests/fixtures/plugins/misbehave.py: raise, hang, wait on their own outcome, return None, NaN, strings, ids of no
registry, rising scores, an empty list, a trace that is not JSON) finishes; each such block is a counted failure of
its kind, left out of every metric and test, with no planner call; every other architecture's results are those of
the same study without the bad plugins; the exit status says blocks failed (5), stderr has one line per failure
and no traceback; the TREC export, scored by pytrec_eval and ranx, gives the report's numbers. An own call that
failed for good leaves its block unscored and unplanned too, built-in or plugin (tests/unit/test_seams.py)."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest
from helpers import FIXTURES
from helpers.browser import console_errors, go, open_page
from helpers.cli import run_cli
from helpers.data import make_data_dir
from helpers.trec import read_qrels, read_run

from evaluator.analysis import stats as S
from evaluator.analysis.metrics import record_obs
from evaluator.results.schema import GOLDS, OutputDir, Record

pytrec_eval = pytest.importorskip("pytrec_eval")

PLUGINS = FIXTURES / "plugins" / "misbehave.py"
BAD_QUERY = ("G1_instruction", 3)  # the query that names Messi: where each bad plugin misbehaves
# class -> (its name, the kind of its failure, words of its one line)
BAD = {
    "Raises": ("raises", "arch_error", "retrieve raised KeyError: 'no such stub'"),
    "Hangs": ("hangs", "timeout", "ran past [run] arch_timeout_s = 2 s of its own time"),
    "SelfLoop": ("selfloop", "cycle", "waits on its own outcome: selfloop -> selfloop"),
    "LoopA": ("loopa", "cycle", "its outcome of 'loopb' failed (cycle): waits on its own outcome: loopb -> loopa"),
    "LoopB": ("loopb", "cycle", "waits on its own outcome: loopb -> loopa -> loopb"),
    "ReturnsNone": ("returnsnone", "contract", "retrieve returned NoneType, not evaluator.study.archs.Discovery"),
    "NoneScores": ("nonescores", "contract", "Discovery.scores[0] is None, not a number"),
    "NanScores": ("nanscores", "contract", "Discovery.scores[0] is nan, not a finite number"),
    "StringScores": ("stringscores", "contract", "Discovery.scores[0] is '"),
    "UnknownIds": ("unknownids", "contract", "Discovery.ids[0] 'Football Data/player transfers' is not in the registry"),
    "RisingScores": ("rising", "contract", "Discovery.scores rise down the list"),
    "Empty": ("empty", "contract", "retrieve returned no ids"),
    "NotJson": ("notjson", "contract", "Discovery.trace is not JSON"),
}
GOOD = ["rtp", "ptr", "rewrite", "route", f"{PLUGINS}:Fine"]  # the same in both studies
KEPT = ("rtp", "ptr", "rewrite", "route", "fine", "both")  # their rows must not move


def spec(cls: str) -> str:
    return f"{PLUGINS}:{cls}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The study with every bad plugin beside the good architectures, and without them (one cache)."""
    root = tmp_path_factory.mktemp("seams")
    data = make_data_dir(root / "data")
    common = ("--data", str(data), "--cache-dir", str(root / "cache"), "--model", "sim", "--runs", "2",
              "--no-progress", "--no-extras", "--arch-timeout", "2", "--ks", "1,3,5")
    bad, base = root / "bad", root / "base"
    r_bad = run_cli(*common, "--archs", ",".join(GOOD + [spec(c) for c in BAD]), "--out", str(bad), cwd=root)
    r_base = run_cli(*common, "--archs", ",".join(GOOD), "--out", str(base), cwd=root)
    return {"root": root, "common": common, "bad": bad, "base": base, "r_bad": r_bad, "r_base": r_base}


def _records(out: Path) -> dict[tuple[int, str, object], Record]:
    return {(r.run, r.subset, r.query_id): r for r in OutputDir(out).read_records()}


def test_the_study_finishes_exit_5_one_line_per_failure_no_traceback(runs) -> None:
    r, base = runs["r_bad"], runs["r_base"]
    assert base.returncode == 0, base.stderr[-3000:]
    assert r.returncode == 5, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = [x for x in r.stderr.splitlines() if x.startswith("error: --archs ")]
    assert len(lines) == len(BAD)  # one line per (architecture, kind), the good ones silent
    for cls, (_, kind, words) in BAD.items():
        mine = [x for x in lines if x.startswith(f"error: --archs {spec(cls)}: ")]
        assert len(mine) == 1, cls
        assert f": {kind} on 2 (query, run) blocks, e.g. model sim run 0 G1_instruction query 3: " in mine[0]
        assert words in mine[0], mine[0]
    assert "26 (query, run) blocks failed" in r.stderr and (runs["bad"] / "report.md").is_file()


@pytest.mark.parametrize("cls", sorted(BAD))
def test_a_misbehaving_plugin_fails_that_block_only(runs, cls: str) -> None:
    name, kind, words = BAD[cls]
    recs = _records(runs["bad"])
    for (_, subset, qid), rec in recs.items():
        block = rec.arch(name)
        assert block is not None
        if (subset, qid) == BAD_QUERY:
            assert block.failure is not None and block.failure.kind == kind and words in block.failure.error
            assert block.retrieved == [] and block.plan is None and block.tokens == {} and block.excluded
        else:  # every other query: its list, its trace, a planner call
            assert block.failure is None and block.retrieved and block.plan is not None and block.plan.usable
            assert block.trace == {"searched": rec.query}
    # scored on the other queries only: the summary's recall per run is their mean
    summary = json.loads((runs["bad"] / "summary.json").read_text(encoding="utf-8"))
    row = next(x for x in summary["rows"] if (x["model"], x["subset"], x["arch"], x["metric"], x["k"], x["gold"])
               == ("sim", "G1_instruction", name, "recall", 5, "api_list"))
    for run in (0, 1):
        kept = [r for (ru, s, q), r in recs.items() if ru == run and s == "G1_instruction" and q != 3]
        want = [record_obs(r, [5], 5)[(name, "recall", 5, "api_list")][0] for r in kept]
        assert row["values"][run] == pytest.approx(sum(want) / len(want))
        assert (name, "recall", 5, "api_list") not in record_obs(recs[(run, *BAD_QUERY)], [5], 5)
    # counted by kind in the report's Errors table; no planner call for it (meta's calls by architecture)
    report = (runs["bad"] / "report.md").read_text(encoding="utf-8")
    assert re.search(rf"^\| G1_instruction \| {name} \| 6 \|.*\| 0 \| {kind} 2 \|$", report, re.M), name
    assert re.search(rf"^\| G2_instruction \| {name} \| 4 \|.*\| 0 \| 0 \|$", report, re.M)
    meta = json.loads((runs["bad"] / "meta.json").read_text(encoding="utf-8"))
    assert meta["runtime"]["arch_calls"]["sim"][name] == 8  # 4 planners per run, none for the failed query


def test_the_other_architectures_are_those_of_the_study_without_the_bad_plugins(runs) -> None:
    bad, base = _records(runs["bad"]), _records(runs["base"])
    assert bad.keys() == base.keys()
    for key, rec in base.items():
        for name in rec.arch_names:
            assert bad[key].arch(name) == rec.arch(name), (key, name)
    rows = {}
    for which in ("bad", "base"):
        summary = json.loads((runs[which] / "summary.json").read_text(encoding="utf-8"))
        rows[which] = [x for x in summary["rows"] if x["arch"] in KEPT]
        rows[which + "_tests"] = summary["tests"]  # the paper's RtP-vs-PtR tests
    assert rows["bad"] == rows["base"] and rows["bad_tests"] == rows["base_tests"] and rows["base"]


def test_the_dry_run_counts_the_calls_the_run_made(runs) -> None:
    out = runs["root"] / "dry"
    r = run_cli(*runs["common"], "--archs", ",".join(GOOD + [spec(c) for c in BAD]), "--out", str(out),
                "--dry-run", cwd=runs["root"])
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads((out / "plan.json").read_text(encoding="utf-8"))["models"]["sim"]
    meta = json.loads((runs["bad"] / "meta.json").read_text(encoding="utf-8"))
    planned = {a: n for a, n in plan["by_arch"].items() if n}  # route makes none of its own
    assert planned == meta["runtime"]["arch_calls"]["sim"] and plan["to_send"] == 0


def test_the_trec_export_scored_by_pytrec_eval_and_ranx_gives_the_reports_numbers(runs, tmp_path: Path) -> None:
    ranx = pytest.importorskip("ranx")
    to = tmp_path / "trec"
    done = run_cli("export", "trec", str(runs["bad"]), "--to", str(to), cwd=runs["root"])
    assert done.returncode == 0, done.stderr
    summary = S.summarize(OutputDir(runs["bad"]).read_records(), [1, 3, 5], 5)
    checked = 0
    for name, _, _ in BAD.values():
        excluded = (to / f"sim.run0.{name}.dense.excluded").read_text(encoding="utf-8").split()
        assert [urllib.parse.unquote(q) for q in excluded] == ["G1_instruction/3"]
    for gold in GOLDS:
        qrels = read_qrels(to / f"qrels.{gold}.txt")
        for path in sorted(to.glob("*.trec")):
            model, run_s, arch, _ = path.stem.split(".")
            run_i = int(run_s[3:])
            run = read_run(path)
            left_out = set(path.with_suffix(".excluded").read_text(encoding="utf-8").split()
                            if path.with_suffix(".excluded").is_file() else [])
            assert not left_out & run.keys()  # a failed block has no line: its NaN or None never reaches a tool
            per_q = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.5", "recall.5", "P.5"}).evaluate(run)
            for subset in summary.subsets:
                qids = [q for q in qrels if urllib.parse.unquote(q).split("/")[0] == subset and q not in left_out]
                row_model = None if arch == "rtp" else model
                for metric, m, rx in (("ndcg", "ndcg_cut_5", "ndcg@5"), ("recall", "recall_5", None),
                                      ("precision", "P_5", None)):
                    row = summary.row(row_model, subset, arch, metric, 5, gold)
                    assert row is not None, (arch, subset, metric)
                    want = row.values[0] if arch == "rtp" else row.values[run_i]
                    mean = sum(per_q.get(q, {}).get(m, 0.0) for q in qids) / len(qids)  # no line: 0, as reported
                    assert mean == pytest.approx(want, abs=1e-9), (path.name, subset, metric, gold)
                    if rx is not None and run_i == 0:  # ranx too, on NDCG of each architecture's first run
                        theirs = ranx.evaluate(ranx.Qrels({q: qrels[q] for q in qids}),
                                               ranx.Run({q: run[q] for q in qids if q in run}), rx,
                                               make_comparable=True)
                        assert float(theirs) == pytest.approx(want, abs=1e-6), (path.name, subset, metric, gold)
                    checked += 1
    assert checked > 300


def test_fail_fast_stops_at_the_first_failure_with_its_line(runs) -> None:
    r = run_cli(*runs["common"], "--archs", f"rtp,{spec('Raises')}", "--fail-fast", "--out",
                str(runs["root"] / "ff"), cwd=runs["root"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --archs {spec('Raises')}: retrieve raised KeyError") and "--fail-fast" in last
    assert "G1_instruction query 3" in last


def test_a_plugin_broken_on_every_query_stops_at_the_probe_before_any_call(runs, tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(
        "from evaluator.study.archs import Discovery\n"
        "class Broken:\n    name = 'broken'\n    async def retrieve(self, ctx):\n"
        "        reply = await ctx.chat([{'role': 'user', 'content': ctx.text}], prompt_version='b-1')\n"
        "        return Discovery([reply.content.strip()], [1.0])\n", encoding="utf-8")
    out = tmp_path / "out"
    r = run_cli(*runs["common"], "--archs", f"rtp,{tmp_path / 'broken.py'}:Broken", "--out", str(out),
                cwd=runs["root"])
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert err[-1].startswith(f"error: --archs {tmp_path / 'broken.py'}:Broken: retrieve raised AttributeError")
    assert "on the probe" in err[-1] and not (out / "queries.jsonl").exists()


# ---------------------------------------------------------------- the viewer shows traces, failures, a route's side


def test_the_query_page_shows_each_architectures_trace_failure_and_side(runs, browser) -> None:
    page = runs["bad"] / "view.html"
    open_page(browser, page)
    data = browser.execute_script("return JSON.parse(document.getElementById('data').textContent)")
    qi = next(i for i, q in enumerate(data["queries"]) if (q["subset"], q["id"]) == BAD_QUERY)
    ri = next(i for i, r in enumerate(data["records"]) if r["q"] == qi)
    go(browser, f"#q={qi}&r={ri}")
    text = {s.get_attribute("id"): s.text for s in browser.find_elements("css selector", ".archs > section.arch")}
    for cls, (name, kind, words) in BAD.items():
        assert f"failed ({kind}): " in text[f"arch-{name}"] and words[:30] in text[f"arch-{name}"], cls
        assert "Top " not in text[f"arch-{name}"]  # no list shown for a failed block
    fine = browser.find_element("css selector", "#arch-fine pre.trace").text
    assert json.loads(fine) == {"searched": data["queries"][qi]["text"]} and "\n  " in fine  # indented JSON
    rewrite = json.loads(browser.find_element("css selector", "#arch-rewrite pre.trace").text)
    assert rewrite["query"] and rewrite["fallback"] is False
    rec = _records(runs["bad"])[(data["records"][ri]["run"], *BAD_QUERY)]
    route = rec.arch("route")
    assert route is not None and route.side in ("rtp", "ptr")
    assert f"routed to {'RtP' if route.side == 'rtp' else 'PtR'}" in text["arch-route"]
    assert json.loads(browser.find_element("css selector", "#arch-route pre.trace").text)["side"] == route.side
    assert "architecture failed" in browser.find_element("css selector", "main").text  # the record's flags
    assert console_errors(browser) == []
