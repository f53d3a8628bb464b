"""Rendering end to end (app.render_outputs): rows recomputed from queries.jsonl, determinism, labels, figures."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from helpers import records as F

from evaluator.app.outputs import render_outputs
from evaluator.results.schema import OutputDir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    meta = F.meta(("sim", "gemini"))
    # as the pipeline writes it: a global "simulated": true (any model) plus the per-model truth
    meta["models"] = [{"name": "sim", "model": "sim", "simulated": True},
                      {"name": "gemini", "model": "gemini-2.5-flash", "simulated": False}]
    d = F.write_out(tmp_path_factory.mktemp("study"), F.study(("sim", "gemini")), meta)
    # A stale file of the old layout: sections are values now, files lying around are never pasted in.
    (d / "sections").mkdir()
    (d / "sections" / "50-scaling.md").write_text("## Stale scaling\n\nold table\n")
    render_outputs(OutputDir(d))
    return d


def _rows(out: Path) -> dict[tuple, dict]:
    summary = json.loads((out / "summary.json").read_text())
    return {(r["model"], r["subset"], r["arch"], r["metric"], r["k"], r["gold"]): r for r in summary["rows"]}


def _records(out: Path) -> list[dict]:
    return [F.flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines()]


def test_rows_recomputed_from_queries(out: Path) -> None:
    rows, recs = _rows(out), _records(out)
    sub, k = "G1_instruction", 5

    # RtP recall@5 [api_list]: one deterministic value per query, model null
    per_q = {r["query_id"]: len(set(r["rtp"]["retrieved"][:k]) & set(r["gold"]["api_list"])) / len(r["gold"]["api_list"])
             for r in recs if r["subset"] == sub}
    row = rows[(None, sub, "rtp", "recall", k, "api_list")]
    assert row["values"] == pytest.approx([statistics.fmean(per_q.values())])

    # PtR precision@3 [relevant] for gemini: per-run mean over queries (discovery failures excluded)
    runs: dict[int, list[float]] = {}
    for r in recs:
        if r["subset"] == sub and r["model"] == "gemini" and not r["ptr"]["discovery_llm_error"]:
            runs.setdefault(r["run"], []).append(len(set(r["ptr"]["retrieved"][:3]) & set(r["gold"]["relevant"])) / 3)
    row = rows[("gemini", sub, "ptr", "precision", 3, "relevant")]
    assert row["values"] == pytest.approx([statistics.fmean(runs[i]) for i in sorted(runs)])
    assert row["std"] == pytest.approx(statistics.stdev(row["values"]))

    # RtP pass rate for sim: planner LLM errors excluded
    runs = {}
    for r in recs:
        p = r["rtp"]["plan"]
        if r["subset"] == sub and r["model"] == "sim" and not p["llm_error"]:
            runs.setdefault(r["run"], []).append(float(bool(p["selected"])))
    assert rows[("sim", sub, "rtp", "pass", k, None)]["values"] == pytest.approx(
        [statistics.fmean(runs[i]) for i in sorted(runs)])

    # divergence at k = 5
    runs = {}
    for r in recs:
        if r["subset"] == sub and r["model"] == "sim" and not r["ptr"]["discovery_llm_error"]:
            runs.setdefault(r["run"], []).append(float(set(r["rtp"]["retrieved"][:k]) != set(r["ptr"]["retrieved"][:k])))
    assert rows[("sim", sub, "both", "divergent", k, None)]["values"] == pytest.approx(
        [statistics.fmean(runs[i]) for i in sorted(runs)])


def test_summary_deterministic(out: Path, tmp_path: Path) -> None:
    first = (out / "summary.json").read_bytes()
    meta = json.loads((out / "meta.json").read_text())
    # records in another order and different LLM accounting, as a cached rerun would write them
    meta["llm_stats"] = {m: {"requests": 0, "cache_hits": 99} for m in ("sim", "gemini")}
    meta["runtime"] = {"created": "2027-01-01T00:00:00"}
    meta["settings"]["out"] = "results/elsewhere"
    again = F.write_out(tmp_path / "again", _records(out), meta, shuffle_seed=7)
    render_outputs(OutputDir(again), with_figures=False)
    assert (again / "summary.json").read_bytes() == first
    render_outputs(OutputDir(again), with_figures=False)
    assert (again / "summary.json").read_bytes() == first
    assert "NaN" not in first.decode()


def test_report_contents(out: Path) -> None:
    md = (out / "report.md").read_text()
    for t in ("Table 1:", "Table 3:", "Table 4:", "Table 5:", "Table 6:", "Table 7:", "Table 8:",
              "Table 11: sim", "Table 11: gemini", "## Decisions", "## Data warnings", "## LLM accounting"):
        assert t in md, t
    assert "SIMULATED LLM — model `sim`" in md and "not a language model" in md
    assert "SIMULATED LLM — model `gemini`" not in md
    assert md.index("gold `api_list`") < md.index("gold `relevant`")
    assert "gold API missing from registry: 2 (e.g. G1 query 7: Foo::bar)" in md
    assert "`gemini` (gemini-2.5-flash)" in md
    assert "Stale scaling" not in md
    # analyses that did not run are listed with why, one line each
    assert "## Skipped tables and analyses" in md and "Scaling study (Table 10): not run" in md
    assert "Table 2: Worked contrasts" in md and "Table 9: Example trajectory" in md
    assert "Completion/q" in md and "completion tokens only" in md
    # every model table states the n it scored per architecture and the truncated replies
    assert md.count("n scored (summed over runs): RtP retrieval 24, RtP planner") >= 10
    assert "truncated replies (finish_reason length): 0" in md
    assert "embedder `all-MiniLM-L6-v2`" in md and "registry 300 APIs (full)" in md


def test_figures(out: Path) -> None:
    figs = sorted((out / "figures").glob("*.png"))
    names = {p.name for p in figs}
    for m in ("sim", "gemini"):
        assert {f"crossover_{m}.png", f"winloss_{m}.png", f"recall_vs_k_{m}.png", f"trajectories_{m}.png"} <= names
    for p in figs:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_retrieval_only_renders(tmp_path: Path) -> None:
    d = F.write_out(tmp_path / "ro", F.retrieval_only(), F.meta((), runs=1, retrieval_only_=True))
    render_outputs(OutputDir(d))
    md = (d / "report.md").read_text()
    assert "retrieval only (no LLM)" in md and "Table 1b: Precision" in md and "SIMULATED" not in md
    rows = json.loads((d / "summary.json").read_text())["rows"]
    assert rows and all(r["model"] is None and r["arch"] == "rtp" for r in rows)
    assert (d / "figures" / "recall_vs_k.png").read_bytes().startswith(PNG_MAGIC)


def test_minimal_meta(tmp_path: Path) -> None:
    """An empty meta.json still renders; the bundled `sim` model is flagged as simulated by name."""
    d = F.write_out(tmp_path / "bare", F.study(("sim",), runs=1), {})
    render_outputs(OutputDir(d), with_figures=False)
    md = (d / "report.md").read_text()
    assert "SIMULATED LLM — model `sim`" in md and "Runs: 1;" in md and "No data warnings." in md


def test_damaged_saved_data_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged queries.jsonl or routing.json: `report` says which file and line, no traceback."""
    from evaluator.cli.main import main

    d = F.write_out(tmp_path / "bad", F.study(("sim",), runs=1), F.meta(("sim",), runs=1))
    good = (d / "queries.jsonl").read_bytes()
    for damage in (b'{"model": "sim", "run"\n', b"\xff\xfe not utf-8\n", b"[1, 2]\n"):
        (d / "queries.jsonl").write_bytes(good + damage)
        assert main(["report", str(d)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "queries.jsonl: line" in err and "Traceback" not in err, err
    (d / "queries.jsonl").write_bytes(good)
    (d / "routing.json").write_text('{"meta": ')
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "routing.json: unreadable JSON" in err, err
