"""Whole runs on query files with names of our own (no G1/G2/G3): every analysis runs with the real
subset names as labels, `report` re-renders byte for byte, and calls that failed for good end the run
with a non-zero status and one line."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.data import QUERIES, make_data_dir
from helpers.procs import simulator

NAMES = ("alpha_easy", "beta_mixed", "omega_hard")


def renamed_data(root: Path, names: tuple[str, ...]) -> Path:
    """The fixture's queries spread over query files named `names` (ids kept unique per file)."""
    data = make_data_dir(root)
    for f in (data / "queries").glob("*.json"):
        f.unlink()
    qs = [q for stem in QUERIES for q in QUERIES[stem]]
    for i, name in enumerate(names):
        part = qs[i::len(names)] if len(names) > 1 else qs
        (data / "queries" / f"{name}.json").write_text(json.dumps(part), encoding="utf-8")
    return data


@pytest.fixture(scope="module")
def run_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("names")
    data = renamed_data(root / "data", NAMES)
    cfg = root / "settings.toml"
    cfg.write_text("[retrieval]\nks = [1, 3, 5]\n[analysis]\nscaling_sizes = [8, 11]\nscaling_seeds = 2\n")
    out = root / "out"
    r = run_cli("--config", str(cfg), "--data", str(data), "--cache-dir", str(root / "cache"), "--model", "sim",
                "--runs", "2", "--out", str(out), "--no-progress", cwd=root)
    return out, r


def test_any_subset_names_get_every_analysis_with_their_labels(run_out) -> None:
    out, r = run_out
    assert r.returncode == 0, r.stderr
    scaling = json.loads((out / "scaling.json").read_text())
    assert scaling["meta"]["subsets"] == ["alpha_easy", "beta_mixed"]  # all but the last in sorted order
    assert scaling["meta"]["divergence_subset"] == "alpha_easy"
    assert {p["subset"] for p in scaling["points"]} == {"alpha_easy", "beta_mixed"}
    routing = json.loads((out / "routing.json").read_text())
    assert routing["meta"]["split"] == {"train": ["alpha_easy", "beta_mixed"], "test": ["omega_hard"]}
    assert routing["models"]["sim"]["heldout"]["api_list"]["subset_split"]

    md = (out / "report.md").read_text()
    assert "| alpha_easy RtP | alpha_easy PtR | beta_mixed RtP | beta_mixed PtR | alpha_easy Div% |" in md
    assert "alpha_easy+beta_mixed → omega_hard" in md
    assert not any(x in md for x in ("| G1", "G1 RtP", "G1 Div%", "G1+", "→ G3"))  # no hard-wired labels
    # the decisions are this run's: its registry, its subsets and counts
    assert "Registry: 14 APIs, choice `full`" in md
    assert "Queries: 5 in 3 subset(s): alpha_easy (2), beta_mixed (2), omega_hard (1)" in md
    assert "47,020" not in md
    summary = json.loads((out / "summary.json").read_text())
    assert {row["subset"] for row in summary["rows"]} == set(NAMES)
    assert "cache_dir" not in json.dumps(summary["meta"])


def test_report_rerenders_byte_identical(run_out) -> None:
    out, r = run_out
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in (out / "report.md", out / "summary.json")}
    figs = {p.name: p.read_bytes() for p in (out / "figures").glob("*.png")}
    (out / "report.md").unlink()
    again = run_cli("report", str(out), cwd=out.parent)
    assert again.returncode == 0, again.stderr
    assert {p: (out / p).read_bytes() for p in before} == before
    assert {"scaling.png", "routing.png"} <= set(figs)
    assert {p.name: p.read_bytes() for p in (out / "figures").glob("*.png")} == figs


def test_routing_command_on_a_finished_run(run_out, tmp_path: Path) -> None:
    src, r = run_out
    assert r.returncode == 0, r.stderr
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    before = json.loads((out / "routing.json").read_text())
    again = run_cli("routing", str(out), cwd=tmp_path)  # meta.json names the run's cache_dir
    assert again.returncode == 0, again.stderr
    after = json.loads((out / "routing.json").read_text())
    before["meta"].pop("timing_s"), after["meta"].pop("timing_s")
    assert after == before  # the same study as the run's own
    bad = run_cli("routing", str(out), "--k", "10", cwd=tmp_path)  # the run saved top-5 lists (ks 1,3,5)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: --k 10 is above the largest k this run saved (5); pass --k 5 or less."), bad.stderr


def test_one_subset_says_why_routing_has_no_split(tmp_path: Path) -> None:
    data = renamed_data(tmp_path / "data", ("solo",))
    out = tmp_path / "out"
    r = run_cli("--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", "sim", "--runs", "2",
                "--ks", "1,3,5", "--out", str(out), "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    md = (out / "report.md").read_text()
    skipped = md[md.index("## Skipped tables and analyses"):md.index("## Decisions")]
    assert "Routing held-out subset split: it needs two subsets" in skipped
    assert json.loads((out / "scaling.json").read_text())["meta"]["subsets"] == ["solo"]


def test_calls_failed_for_good_exit_non_zero_with_one_line(tmp_path: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    with simulator(p_500=1.0) as sim:
        prof = tmp_path / "failing.toml"
        prof.write_text(f'model = "sim-1"\n[connection]\nbase_url = "{sim.base_url}"\n[server]\nsimulated = true\n'
                        "[retries]\nmax_retries = 0\nbackoff_base_s = 0.01\n", encoding="utf-8")
        r = run_cli("--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--model", str(prof), "--runs", "1",
                    "--ks", "1,5", "--out", str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    last = [x for x in r.stderr.strip().splitlines() if x.startswith("error:")]
    assert len(last) == 1 and "failed for good" in last[0] and "http_500" in last[0] and "rerun" in last[0].lower()
    assert (tmp_path / "out" / "report.md").is_file()  # what could be scored is still written
