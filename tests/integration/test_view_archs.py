"""The viewer with four architectures (records holding RtP, PtR and two more), in headless Chromium, as a person
would check it: a query page shows every architecture side by side, the Architectures tab compares any two
picked (its per-query wins recomputed here from queries.jsonl) with the analysis's Holm-adjusted tests."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from helpers import records as F
from helpers.browser import choose, console_errors, go, open_page
from helpers.records import with_extra_archs

from evaluator.app.outputs import render_outputs
from evaluator.results.schema import OutputDir

ARCHS = ["rtp", "ptr", "hyde", "fusion"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    recs = with_extra_archs(F.study(("sim",), runs=2))
    d = F.write_out(tmp_path_factory.mktemp("archs") / "out", recs, F.meta(("sim",), runs=2))
    render_outputs(OutputDir(d), with_figures=False)
    return d


def _recall(block: dict, gold: list[str], k: int = 5) -> float:
    return len(set(block["retrieved"][:k]) & set(gold)) / len(gold)


def test_a_query_page_shows_every_architecture_side_by_side(out, browser) -> None:
    open_page(browser, out / "view.html")
    data = browser.execute_script("return JSON.parse(document.getElementById('data').textContent)")
    i, rec = next((i, r) for i, r in enumerate(data["records"]) if r["q"] == 3)
    go(browser, f"#q={rec['q']}&r={i}")
    sections = browser.find_elements("css selector", ".archs > section.arch")
    assert [s.get_attribute("id") for s in sections] == ["rtp", "ptr", "arch-hyde", "arch-fusion"]
    for name in ("hyde", "fusion"):
        shown = browser.find_elements("css selector", f"#arch-{name} table.top tbody tr")
        assert len(shown) == len(data["lists"][rec["blocks"][name]["top"]][0])
        assert "Selected APIs" in browser.find_element("id", f"arch-{name}").text
    status = [p.text for p in browser.find_elements("css selector", "main p.status")]
    assert "hyde api_list" in status[0] and "; fusion NDCG@5" in status[1]  # recall, then NDCG/MRR/COMP of each
    assert console_errors(browser) == []


def test_any_two_architectures_are_compared(out, browser) -> None:
    open_page(browser, out / "view.html", "#archs")
    assert [o.get_attribute("value") for o in browser.find_elements("css selector", "#x-a option")] == ARCHS
    choose(browser, "x-a", "hyde")
    choose(browser, "x-b", "fusion")
    # independently: run-averaged recall@5 (gold api_list) per query, hyde vs fusion, from queries.jsonl
    vals: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for line in (out / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        g = r["gold"]["api_list"]
        vals[(r["subset"], r["query_id"])].append((_recall(r["archs"]["hyde"], g), _recall(r["archs"]["fusion"], g)))
    avg = {q: tuple(sum(x[i] for x in v) / len(v) for i in (0, 1)) for q, v in vals.items()}
    wins_a = sum(a > b + 1e-12 for a, b in avg.values())
    wins_b = sum(b > a + 1e-12 for a, b in avg.values())
    rows = browser.find_elements("css selector", "#x-rows tbody tr")
    assert len(rows) == len(avg)
    count = browser.find_element("id", "x-count").text
    assert f"hyde wins {wins_a}, fusion wins {wins_b}" in count
    # the tests shown are the analysis's hyde-vs-fusion pairs (summary.json `comparisons`)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    pairs = [p for p in summary["comparisons"]["pairs"] if (p["a"], p["b"]) == ("hyde", "fusion")
             and p["gold"] in ("api_list", None)]
    shown = browser.find_elements("css selector", "#x-tests tbody tr")
    assert len(shown) == len(pairs) and pairs
    first = shown[0].find_elements("css selector", "td")
    assert first[2].text == pairs[0]["subset"] and first[3].text == pairs[0]["metric"]
    assert browser.find_elements("css selector", "#x-friedman tbody tr")
    rows[0].click()
    assert "query" in browser.find_element("css selector", "main h2").text
    assert console_errors(browser) == []
