"""A large run's viewer is paged (issue 31, item 9): beyond `PART_RECORDS` records view.html holds the overview
and a list of parts, each part's records sit in a script beside it, and the page opened from file:// in headless
Chromium loads them one at a time. Checked on a small threshold (the size rule is the same), as a person would:
every record is listed in some part, a query page of a later part opens, the comparison still works."""

from __future__ import annotations

import json
import re

import pytest
from helpers import EXAMPLE
from helpers.browser import choose, console_errors, open_page, rows
from helpers.cli import run_cli

from evaluator.app import viewer as VW
from evaluator.results.schema import OutputDir

PART = 12  # records per part in these tests (the shipped PART_RECORDS is 5,000)


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    root = tmp_path_factory.mktemp("paged")
    common = ("--data", str(EXAMPLE), "--model", "sim", "--cache-dir", str(root / "cache"), "--no-progress",
              "--no-extras")
    a, b = root / "a", root / "b"
    for out, extra in ((a, ("--runs", "2")), (b, ("--runs", "1", "--k", "3"))):
        r = run_cli(*common, *extra, "--out", str(out), cwd=root)
        assert r.returncode == 0, r.stderr[-3000:]
    return {"root": root, "a": a, "b": b}


def _records(out):
    return [json.loads(x) for x in (out / "queries.jsonl").read_text(encoding="utf-8").splitlines()]


def _inline(html: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S).group(1))


def test_a_small_run_stays_one_self_contained_page(outs):
    html = (outs["a"] / "view.html").read_text(encoding="utf-8")
    assert "parts" not in _inline(html) and not (outs["a"] / "view-data").exists()


def test_beyond_the_threshold_the_records_move_to_parts_of_whole_queries(outs):
    od = OutputDir(outs["a"])
    inline = (outs["a"] / "view.html").stat().st_size
    path, text = VW.write_page([od], part_records=PART)
    data = _inline(text)
    recs = _records(outs["a"])
    assert data["records"] == [] and data["total_records"] == len(recs)
    files = sorted((outs["a"] / "view-data").glob("part-*.js"))
    assert [p["file"] for p in data["parts"]] == [f"view-data/{f.name}" for f in files] and len(files) > 2
    seen = []
    for f in files:
        part = json.loads(f.read_text(encoding="utf-8").removeprefix(f"window.viewPart({files.index(f)}, ")
                          .removesuffix(");\n"))
        keys = {(q["subset"], q["id"]) for q in part["queries"]}
        seen += [(part["queries"][r["q"]]["subset"], part["queries"][r["q"]]["id"], r["side"], r["run"])
                 for r in part["records"]]
        assert len(part["records"]) < 2 * PART
        assert all(len([r for r in recs if (r["subset"], r["query_id"]) == k]) ==
                   len([r for r in part["records"] if (part["queries"][r["q"]]["subset"], part["queries"][r["q"]]["id"]) == k])
                   for k in keys)  # a query's records are all in one part
    assert len(seen) == len(set(seen)) == len(recs)
    assert path.stat().st_size < inline  # the page keeps only the overview and the list of parts
    # back under the threshold: one page again, and the parts folder is gone
    VW.write_page([od])
    assert not (outs["a"] / "view-data").exists() and "parts" not in _inline((outs["a"] / "view.html").read_text())


def test_the_paged_page_opens_from_file_and_loads_each_part(outs, browser, tmp_path):
    page, _ = VW.write_page([OutputDir(outs["a"])], tmp_path / "big.html", part_records=PART)
    recs = _records(outs["a"])
    open_page(browser, page, "#queries")
    browser.execute_script("return new Promise(done => setTimeout(done, 300))")
    assert browser.execute_script("return document.body.dataset.part") == "0"
    n_parts = len(browser.find_elements("css selector", "#f-part option"))
    assert n_parts > 2
    listed = []
    for i in range(n_parts):
        choose(browser, "f-part", str(i))
        browser.execute_script("return new Promise(done => setTimeout(done, 300))")
        assert browser.execute_script("return document.body.dataset.part") == str(i)
        choose(browser, "p-size", "all")
        listed += [(r[0], r[1], r[3], r[4]) for r in rows(browser)]
    assert sorted(listed) == sorted((r["subset"], str(r["query_id"]), r["model"], str(r["run"])) for r in recs)
    # a query page of the last part, opened by its link
    browser.find_element("css selector", "#rows tr").click()
    browser.execute_script("return new Promise(done => setTimeout(done, 300))")
    assert "#p=" in browser.current_url and browser.find_elements("css selector", "section.arch#ptr")
    # what the page loaded: its own part scripts beside it, nothing else
    loaded = browser.execute_script("return [...document.querySelectorAll('script[src]')].map(s => s.src)")
    assert len(loaded) == n_parts and all(x.startswith("file://") and "/big-data/part-" in x for x in loaded)
    assert console_errors(browser) == []


def test_a_paged_comparison_keeps_its_metrics_over_every_query(outs, browser, tmp_path):
    dst = tmp_path / "cmp.html"
    whole = _inline(VW.write_page([OutputDir(outs["a"]), OutputDir(outs["b"])], dst)[1])
    paged = _inline(VW.write_page([OutputDir(outs["a"]), OutputDir(outs["b"])], dst, part_records=PART)[1])
    for p, q in zip(whole["compare"]["pairs"], paged["compare"]["pairs"], strict=True):
        assert p["metrics"] == q["metrics"] and p["shared"] == q["shared"] and q["queries"] == []
    open_page(browser, dst, "#compare")
    browser.execute_script("return new Promise(done => setTimeout(done, 300))")
    assert "Metric deltas" in browser.find_element("tag name", "main").text
    assert browser.find_elements("css selector", "table.deltas tbody tr")
    assert console_errors(browser) == []
