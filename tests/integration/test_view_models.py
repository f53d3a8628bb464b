"""`view A B [C]` over runs of different models and retrievers on the same queries: every side keeps its own
records (a side was once filtered by the last side's model: "have no query in common"), and the comparison's
numbers are those recomputed here from each folder's queries.jsonl; the page renders it in headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import EXAMPLE
from helpers.browser import console_errors, open_page
from helpers.cli import run_cli

from evaluator.analysis.metrics import record_obs
from evaluator.results.schema import OutputDir

K = 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """sim, sim-b, sim with BM25, and one folder holding both models: the same data (examples/mcp), one cache."""
    root = tmp_path_factory.mktemp("models")
    common = ("--data", str(EXAMPLE), "--cache-dir", str(root / "cache"), "--runs", "1", "--no-progress",
              "--no-extras", "--k", str(K))
    out = {"root": root}
    for name, extra in (("sim", ("--model", "sim")), ("simb", ("--model", "sim-b")),
                        ("bm25", ("--model", "sim", "--retriever", "bm25")),
                        ("both", ("--model", "sim", "--model", "sim-b"))):
        out[name] = root / name
        r = run_cli(*common, *extra, "--out", str(out[name]), cwd=root)
        assert r.returncode == 0, r.stderr[-3000:]
    return out


def _page_data(page: Path) -> dict:
    html = page.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S).group(1))


def _means(folder: Path, model: str) -> dict[tuple[str, str, str | None], float]:
    """Each compared metric's mean over every query of one side (run-averaged per query first), from its records."""
    per_query: dict[tuple, dict[tuple, list[float]]] = {}
    for r in OutputDir(folder).read_records():
        if r.model != model:
            continue
        k = K
        obs = record_obs(r, [k], k)
        for arch, metric, gold in (("ptr", "recall", "api_list"), ("rtp", "recall", "api_list"), ("ptr", "pass", None)):
            if (o := obs.get((arch, metric, k, gold))) is not None:
                per_query.setdefault((arch, metric, gold), {}).setdefault((r.subset, r.query_id), []).append(o[0])
    return {key: sum(sum(v) / len(v) for v in qs.values()) / len(qs) for key, qs in per_query.items()}


def _check_pair(pair: dict, a: dict, b: dict) -> None:
    assert pair["shared"] == 32 and pair["only_a"] == pair["only_b"] == 0
    seen = 0
    for m in pair["metrics"]:
        key = (m["arch"], m["metric"], m["gold"])
        if m["subset"] == "all" and key in a:
            assert m["a"] == pytest.approx(a[key], abs=1e-6) and m["b"] == pytest.approx(b[key], abs=1e-6), key
            seen += 1
    assert seen == 3


def test_two_models_compared(folders) -> None:
    page = folders["root"] / "ab.html"
    r = run_cli("view", str(folders["sim"]), str(folders["simb"]), "--out", str(page), cwd=folders["root"])
    assert r.returncode == 0 and r.stdout.strip() == str(page), r.stderr
    data = _page_data(page)
    assert [s["label"] for s in data["sides"]] == ["sim · sim", "simb · sim-b"]
    # (the simulator answers both profiles alike: what matters is that each side is its own folder's model)
    _check_pair(data["compare"]["pairs"][0], _means(folders["sim"], "sim"), _means(folders["simb"], "sim-b"))
    # one folder holding both models compares them the same way
    page = folders["root"] / "both.html"
    r = run_cli("view", str(folders["both"]), "--out", str(page), cwd=folders["root"])
    assert r.returncode == 0, r.stderr
    both = _page_data(page)
    assert [s["model"] for s in both["sides"]] == ["sim", "sim-b"]
    _check_pair(both["compare"]["pairs"][0], _means(folders["both"], "sim"), _means(folders["both"], "sim-b"))
    assert both["compare"]["pairs"][0]["metrics"] == data["compare"]["pairs"][0]["metrics"]


def test_three_folders_of_models_and_retrievers_compared_in_the_browser(folders, browser) -> None:
    page = folders["root"] / "abc.html"
    r = run_cli("view", str(folders["sim"]), str(folders["simb"]), str(folders["bm25"]), "--out", str(page),
                cwd=folders["root"])
    assert r.returncode == 0, r.stderr
    data = _page_data(page)
    pairs = data["compare"]["pairs"]
    assert [(p["a"], p["b"]) for p in pairs] == [(0, 1), (0, 2)]
    sim = _means(folders["sim"], "sim")
    _check_pair(pairs[0], sim, _means(folders["simb"], "sim-b"))
    _check_pair(pairs[1], sim, _means(folders["bm25"], "sim"))
    differ = {row[0]: row[1:] for row in data["compare"]["differ"]}
    assert differ["settings.retrieval.retriever"] == ["dense", "dense", "bm25"]
    open_page(browser, page, "#compare")
    titles = [h.text for h in browser.find_elements("css selector", "section.pair h3")]
    assert titles == ["sim · sim (A) vs simb · sim-b (B)", "sim · sim (A) vs bm25 · sim (B)"]
    for section in browser.find_elements("css selector", "section.pair"):
        rows = section.find_elements("css selector", "table.num tbody tr")
        assert len(rows) >= 3 and "Both have the same 32 queries." in section.text
    assert console_errors(browser) == []
