"""`python -m evaluator view`: the page opened in a real headless Chromium (Debian's `chromium` and its
`chromedriver`, driven by selenium) on output folders of a small simulator study on examples/mcp, checked as a
person would: every query listed, a filter changes the rows, a query page shows the stubs and their hits, the
comparison lists the flipped queries, nothing is fetched from the network and the console shows no error.
Bad input ends in one line (exit 2)."""

from __future__ import annotations

import base64
import json
import re
import signal
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
import scipy.stats
from helpers import EXAMPLE
from helpers.browser import choose, console_errors, go, open_page, rows
from helpers.cli import CLI, run_cli
from helpers.procs import read_line, started
from helpers.records import flat


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run A: sim, 2 runs, k = 5, every query. Run B: 1 run, k = 3, the first 5 queries of each subset (so the
    query sets differ and outcomes at k move). One embedding cache for both."""
    root = tmp_path_factory.mktemp("view")
    common = ("--data", str(EXAMPLE), "--model", "sim", "--cache-dir", str(root / "cache"), "--no-progress",
              "--no-extras")
    a, b = root / "run_a", root / "run_b"
    for out, extra in ((a, ("--runs", "2")), (b, ("--runs", "1", "--k", "3", "--limit", "5"))):
        r = run_cli(*common, *extra, "--out", str(out), cwd=root)
        assert r.returncode == 0, r.stderr[-3000:]
    return {"root": root, "a": a, "b": b}


def records(out: Path) -> list[dict]:
    return [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------- the command


def test_a_run_and_report_write_the_page(outs) -> None:
    page = outs["a"] / "view.html"
    assert page.is_file()  # written by the run itself
    page.unlink()
    r = run_cli("report", str(outs["a"]), cwd=outs["root"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert page.is_file()


def test_view_prints_the_path_of_one_self_contained_file(outs) -> None:
    r = run_cli("view", str(outs["a"]), cwd=outs["root"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(outs["a"] / "view.html")
    html = (outs["a"] / "view.html").read_text(encoding="utf-8")
    # no external script, style, image or module reference (query texts may mention URLs, as data)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert not re.search(r"""@import|<link[^>]+stylesheet|\bimport\s.+\sfrom\s""", html)
    # API ids are stored once, in a table; every figure is inline
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S).group(1))
    figures = data["datasets"][0]["figures"]
    assert sorted(f["name"] for f in figures) == sorted(p.name for p in (outs["a"] / "figures").glob("*.png"))
    assert all(base64.b64decode(f["png"]).startswith(b"\x89PNG") for f in figures)
    assert len(data["apis"]) == len(set(data["apis"])) and len(data["records"]) == len(records(outs["a"]))


def test_bad_input_is_one_line(outs, tmp_path) -> None:
    r = run_cli("view", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "not an evaluator output folder" in r.stderr
    bad = tmp_path / "damaged"
    bad.mkdir()
    lines = (outs["a"] / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    (bad / "queries.jsonl").write_text("\n".join([lines[0], lines[1][:50], *lines[2:]]) + "\n", encoding="utf-8")
    r = run_cli("view", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "queries.jsonl: line 2 is not a record" in r.stderr
    r = run_cli("view", str(outs["a"]), str(outs["b"]), cwd=tmp_path)
    assert r.returncode == 2 and "--out" in r.stderr and r.stderr.strip().count("\n") == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "queries.jsonl").write_text("".join(
        json.dumps({**rec, "subset": "elsewhere"}) + "\n" for rec in records(outs["b"])), encoding="utf-8")
    r = run_cli("view", str(outs["a"]), str(other), "--out", str(tmp_path / "x.html"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no query in common" in r.stderr
    assert not (tmp_path / "x.html").exists()


def test_serve_answers_the_page_on_localhost_only(outs) -> None:
    local = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    # stopped by group however the test ends; stdout unbuffered, so that each line is waited for where it is
    with started([*CLI, "view", str(outs["a"]), "--serve"], cwd=outs["root"], text=False, bufsize=0) as proc:
        assert read_line(proc).strip() == str(outs["a"] / "view.html")
        url = re.search(r"http://127\.0\.0\.1:\d+/", read_line(proc)).group(0)
        with local.open(url, timeout=120) as resp:
            assert resp.read() == (outs["a"] / "view.html").read_bytes()
        with pytest.raises(urllib.error.HTTPError) as e:  # the page only, not the folder beside it
            local.open(url + "meta.json", timeout=120)
        assert e.value.code == 404
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the server stops, exit 0
        assert proc.wait(timeout=120) == 0


# ---------------------------------------------------------------- in the browser


def test_explorer_lists_every_query_and_filters_change_the_rows(outs, browser) -> None:
    page = outs["a"] / "view.html"
    open_page(browser, page, "#queries")
    recs = records(outs["a"])
    choose(browser, "p-size", "all")
    shown = rows(browser)
    assert len(shown) == len(recs)
    assert {(r[0], r[1]) for r in shown} == {(x["subset"], str(x["query_id"])) for x in recs}
    # nothing was fetched: the page is all there is
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0

    choose(browser, "f-outcome", "ptr")
    wins = rows(browser)
    assert 0 < len(wins) < len(recs) and all(r[8] == "PtR wins" for r in wins)
    choose(browser, "f-outcome", "")
    choose(browser, "f-subset", "multi")
    multi = rows(browser)
    assert len(multi) == sum(x["subset"] == "multi" for x in recs) and {r[0] for r in multi} == {"multi"}

    choose(browser, "f-subset", "")
    choose(browser, "p-size", "50")  # pages of 50: the first, then the rest
    first = rows(browser)
    assert len(first) == 50 and browser.find_element("id", "p-info").text == f"rows 1–50 of {len(recs)}"
    browser.find_element("id", "p-next").click()
    assert len(first) + len(rows(browser)) == len(recs) and rows(browser)[0] != first[0]
    choose(browser, "p-size", "all")
    target = recs[0]
    search = browser.find_element("id", "f-search")
    search.send_keys(target["query"][:30])
    browser.execute_script("return new Promise(done => setTimeout(done, 400))")  # the search waits for typing to pause
    found = [r[2] for r in rows(browser)]
    assert found and all(target["query"][:30] in q for q in found)
    assert console_errors(browser) == []


def test_query_page_shows_stubs_their_hits_and_which_stub_found_each_api(outs, browser) -> None:
    page = outs["a"] / "view.html"
    open_page(browser, page)
    data = browser.execute_script("return JSON.parse(document.getElementById('data').textContent)")
    # a record with two or more stubs, and its own rank in the page's record list
    i, rec = next((i, r) for i, r in enumerate(data["records"]) if r.get("ptr") and len(r["ptr"]["stubs"]) >= 2)
    go(browser, f"#q={rec['q']}&r={i}")
    stubs = browser.find_elements("css selector", "#ptr .stub")
    assert len(stubs) == len(rec["ptr"]["stubs"])
    for stub, (name, *_rest), hits in zip(stubs, rec["ptr"]["stubs"], rec["ptr"]["hits"], strict=True):
        assert name in stub.find_element("css selector", "h5").text
        assert len(stub.find_elements("css selector", "table.top tbody tr")) == len(data["lists"][hits][0])
    union = browser.find_elements("css selector", "#ptr > table.top tbody tr")
    assert len(union) == len(data["lists"][rec["ptr"]["top"]][0])
    assert all(re.search(r"#\d+ .+ \(rank \d+\)", row.find_elements("css selector", "td")[-1].text) for row in union)
    rtp_rows = browser.find_elements("css selector", "#rtp table.top tbody tr")
    assert len(rtp_rows) == len(data["lists"][rec["rtp"]["top"]][0])
    q = data["queries"][rec["q"]]
    gold = {data["apis"][g] for g in q["gold"][0]}
    marked = {r.find_elements("css selector", "td")[1].text for r in rtp_rows if r.find_elements("css selector", ".gold.g0")}
    top = {data["apis"][x] for x in data["lists"][rec["rtp"]["top"]][0]}
    assert marked == gold & top
    assert "Selected APIs" in browser.find_element("id", "rtp").text
    runs = browser.find_elements("css selector", "table.runs tbody tr")
    assert len(runs) == sum(r["q"] == rec["q"] for r in data["records"])  # every run of this query
    assert console_errors(browser) == []


def run_avg(recs: list[dict], k: int) -> dict[tuple[str, str], tuple[float, float]]:
    """Independently of the viewer: per query, (RtP, PtR) recall at k on gold api_list, averaged over runs."""
    vals: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in recs:
        g = set(r["gold"]["api_list"])
        vals[(r["subset"], str(r["query_id"]))].append(
            tuple(len(set(r[x]["retrieved"][:k]) & g) / len(g) for x in ("rtp", "ptr")))
    return {q: tuple(sum(x[i] for x in v) / len(v) for i in (0, 1)) for q, v in vals.items()}


def flipped(a: dict, b: dict) -> set[tuple[str, str]]:
    """Queries whose run-averaged outcome (PtR wins, RtP wins, tie, both miss) differs between two runs."""
    def outcome(rtp: float, ptr: float) -> str:
        return "ptr" if ptr > rtp + 1e-12 else "rtp" if rtp > ptr + 1e-12 else "miss" if rtp == 0 else "tie"
    return {q for q in a.keys() & b.keys() if outcome(*a[q]) != outcome(*b[q])}


def test_comparison_lists_flipped_queries_and_shows_the_restriction(outs, browser) -> None:
    page = outs["root"] / "compare.html"
    r = run_cli("view", str(outs["a"]), str(outs["b"]), "--out", str(page), cwd=outs["root"])
    assert r.returncode == 0 and r.stdout.strip() == str(page), r.stderr
    open_page(browser, page, "#compare")
    a, b = records(outs["a"]), records(outs["b"])
    avg_a, avg_b = run_avg(a, 5), run_avg(b, 3)
    expected = flipped(avg_a, avg_b)
    shown = browser.execute_script(
        "return [...document.querySelectorAll('table.flipped tbody tr')].map(tr => [tr.cells[0].textContent, tr.cells[1].textContent])")
    assert {tuple(x) for x in shown} == expected and expected, "the simulator study should flip some queries at k=3"
    shared = len({(x["subset"], x["query_id"]) for x in b})
    only_a = len({(x["subset"], x["query_id"]) for x in a}) - shared
    restrict = browser.find_element("css selector", ".restrict").text
    assert f"Restricted to the {shared} queries" in restrict and f"{only_a} only in run_a" in restrict
    differ = browser.execute_script("return [...document.querySelectorAll('main > table.kv tbody tr')].map(tr => tr.cells[0].textContent)")
    assert "k" in differ and "settings.data.limit" in differ
    # the paired test against scipy's Wilcoxon on the same per-query values (exact without ties, else normal approx.)
    data = browser.execute_script("return JSON.parse(document.getElementById('data').textContent)")
    row = next(m for m in data["compare"]["pairs"][0]["metrics"]
               if (m["subset"], m["arch"], m["metric"], m["gold"]) == ("all", "ptr", "recall", "api_list"))
    common = sorted(avg_a.keys() & avg_b.keys())
    x, y = [avg_a[q][1] for q in common], [avg_b[q][1] for q in common]
    assert row["n"] == len(common) and row["a"] == pytest.approx(sum(x) / len(x)) and row["b"] == pytest.approx(sum(y) / len(y))
    d = [round(v - u, 9) for u, v in zip(x, y, strict=True)]
    nz = [abs(v) for v in d if v]
    if nz:
        method = "exact" if len(set(nz)) == len(nz) and len(nz) <= 50 else "approx"
        assert row["p"] == pytest.approx(scipy.stats.wilcoxon(d, zero_method="wilcox", method=method).pvalue)
    assert browser.find_elements("css selector", "section.pair table.num tbody tr")
    browser.find_element("css selector", "table.flipped tbody tr").click()
    assert "query" in browser.find_element("css selector", "main h2").text
    assert console_errors(browser) == []
