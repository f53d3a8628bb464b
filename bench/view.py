"""Benchmark: the results viewer at paper scale — `view.html`'s size, the time to build it, and the time to
first render and to filter in a real headless Chromium (Debian's `chromium`, driven by selenium).

Two runs:
- *paper run*: the lead's full `python -m evaluator --model sim --runs 4` output (1,476 records: 369 queries x
  4 runs, one simulated model), `/work/baseline/full` or `--baseline DIR`.
- *4,000 records*: 500 queries x 4 runs x 2 models SYNTHESISED from that run (no new LLM call): the 369 queries
  plus the first 131 re-asked under a new id, and a second model `sim-b` whose records for run r are the
  simulator's records of run (r + 1) mod 4 (so its outcomes differ per query while every block is a real
  simulator output). Its summary, figures and report come from `app.render_outputs`, as after a run.

In the browser: *first view* is `performance.now()` when the viewer's script has put the overview in the DOM
(from navigation start: reading the file, parsing the inline JSON, building the view); *first paint* is Chromium's
first-contentful-paint. Both are set beside the same figures for an empty page in the same browser, so the
load on this shared machine cancels out of the ratio. *explorer*: the list of every record, its first page
(100 rows) laid out; *filter*: outcome = PtR wins chosen, the new first page laid out; *filter off*: back to
every record; *all rows*: every record on one page ("all" rows per page).
Medians of 3 loads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from evaluator.app import viewer
from evaluator.app.outputs import render_outputs
from evaluator.results.schema import Meta, OutputDir, as_records, plain

from .common import Goal, Result, Stamp, finish, temp_dir

NAME = "view"
MEASURES = ("evaluator/render/view_page.py", "evaluator/render/view_assets", "evaluator/app/viewer.py", "bench/view.py")  # the code it measures (`python -m bench --check`)
TITLE = "Results viewer: view.html size, build time, first render and filter in headless Chromium"
BASELINE = Path(os.environ.get("EVALUATOR_BASELINE", "/work/baseline/full"))
LOADS = 3
REASKED = 131  # 369 + 131 = 500 queries, as in the fanout benchmark
FIRST_VIEW_S, FILTER_S = 1.0, 0.2  # "opens and filters without delay"

_MEASURE = """
const [explorer, done] = [arguments[0], arguments[arguments.length - 1]];
const fcp = () => new Promise(resolve => new PerformanceObserver((list, obs) => {
  const e = list.getEntries().find(x => x.name === 'first-contentful-paint');
  if (e) { obs.disconnect(); resolve(e.startTime); }
}).observe({type: 'paint', buffered: true}));
const timed = (id, value) => {  // a control's change, with the DOM work and the layout it causes
  const sel = document.getElementById(id);
  sel.value = value;
  const t = performance.now();
  sel.dispatchEvent(new Event('change'));
  document.body.offsetHeight;
  return performance.now() - t;
};
fcp().then(paint => {
  const out = {ready: window.viewReadyMs ?? null, fcp: paint};
  if (!explorer) { done(out); return; }  // the empty page: load figures only
  window.addEventListener('hashchange', () => {  // runs after the viewer's own listener has built the list
    document.body.offsetHeight;
    out.explorer = performance.now() - t0;  // the list's first page, laid out
    out.filter = timed('f-outcome', 'ptr');
    out.filtered = document.querySelectorAll('#rows tr').length;
    out.unfilter = timed('f-outcome', '');
    out.all = timed('p-size', 'all');
    out.rows = document.querySelectorAll('#rows tr').length;
    done(out);
  }, {once: true});
  const t0 = performance.now();
  location.hash = 'queries';
});
"""


def synthesise(src: OutputDir, dst: OutputDir) -> int:
    """The 4,000-record run (see the module docstring) from the paper run; returns its record count."""
    recs = [plain(r) for r in src.read_records()]
    queries = sorted({(r["subset"], str(r["query_id"])) for r in recs})
    again = set(queries[:REASKED])
    out: list[dict[str, Any]] = []
    runs = sorted({r["run"] for r in recs})
    by_key = {(r["subset"], str(r["query_id"]), r["run"]): r for r in recs}
    for r in recs:
        copies = [r]
        if (r["subset"], str(r["query_id"])) in again:
            copies.append(r | {"query_id": f"{r['query_id']}-again", "query": r["query"] + " (asked again)"})
        for c in copies:
            out.append(c)
            shifted = by_key[(r["subset"], str(r["query_id"]), runs[(runs.index(r["run"]) + 1) % len(runs)])]
            out.append(c | {"model": "sim-b", "ptr": shifted.get("ptr"),
                            "rtp": (c.get("rtp") or {}) | {"plan": (shifted.get("rtp") or {}).get("plan"),
                                                           "tokens": (shifted.get("rtp") or {}).get("tokens")}})
    meta = plain(src.read_meta())
    meta["models"] = [*meta["models"], meta["models"][0] | {"name": "sim-b"}]
    meta["subsets"] = {s: n + sum(1 for q in again if q[0] == s) for s, n in meta["subsets"].items()}
    meta["llm_stats"], meta["cost"] = {}, {}  # no call was made for this run
    dst.write_meta(Meta.from_dict(meta))
    return dst.write_records(as_records(out))


def _driver():
    # optional: the dev extra's selenium and the system's chromium (both installed by .ci/setup)
    from selenium import webdriver

    os.environ.setdefault("SE_OFFLINE", "true")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")))


def _browse(driver, page: Path, explorer: bool = True) -> dict[str, float]:
    """Median over LOADS fresh loads of each browser figure (ms)."""
    runs = []
    for _ in range(LOADS):
        driver.get("about:blank")
        driver.get(page.as_uri())
        runs.append(driver.execute_async_script(_MEASURE, explorer))
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if runs[0][k] is not None}


def _page(od: OutputDir, out: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    path, html = viewer.write_page([od], out)
    return time.perf_counter() - t0, path.stat().st_size


def run(baseline: Path = BASELINE) -> Result:
    if not (baseline / "queries.jsonl").is_file():
        raise RuntimeError(f"{baseline}: no finished run; pass --baseline DIR (a `--model sim --runs 4` output)")
    rows, data = [], {}
    driver = _driver()
    driver.set_script_timeout(120)  # a loaded 2-core machine; the figures say how long it really took
    try:
        with temp_dir("view") as tmp:
            empty = tmp / "empty.html"
            empty.write_text("<!doctype html><html><body><p>empty</p><script>window.viewReadyMs = performance.now();"
                             "</script></body></html>", encoding="utf-8")
            floor = _browse(driver, empty, explorer=False)
            synth = OutputDir(tmp / "synth")
            t0 = time.perf_counter()
            n_synth = synthesise(OutputDir(baseline), synth)
            render_outputs(synth)  # summary, figures, report.md and view.html, as after a run
            synth_s = time.perf_counter() - t0
            for label, od in (("paper run", OutputDir(baseline)), ("4,000 records (synthesised)", synth)):
                n = sum(1 for _ in (od.path / "queries.jsonl").open(encoding="utf-8"))
                build_s, size = _page(od, tmp / f"{len(data)}.html")
                b = _browse(driver, tmp / f"{len(data)}.html")
                if b.get("rows") != n:
                    raise RuntimeError(f"{label}: the explorer listed {b.get('rows')} rows of {n} records")
                data[label] = {"records": n, "bytes": size, "build_s": build_s, "browser_ms": b}
                rows.append([label, n, round(size / 2**20, 2), round(build_s, 2), round(b["ready"]), round(b["fcp"]),
                             round(b["ready"] / floor["ready"], 1), round(b["explorer"]), round(b["filter"]),
                             round(b["unfilter"]), round(b["all"])])
    finally:
        driver.quit()
    big = data["4,000 records (synthesised)"]["browser_ms"]
    return Result(
        name=NAME, title=TITLE,
        columns=["run", "records", "view.html MiB", "build s", "first view ms", "first paint ms",
                 "first view / empty page", "explorer ms", "filter ms", "filter off ms", "all rows ms"],
        rows=rows,
        goals=[Goal("first view of the 4,000-record page, s", big["ready"] / 1000, f"<= {FIRST_VIEW_S:g}",
                    big["ready"] / 1000 <= FIRST_VIEW_S),
               Goal("the 4,000-record list's first page, s", big["explorer"] / 1000, f"<= {FILTER_S:g}",
                    big["explorer"] / 1000 <= FILTER_S),
               Goal("a filter over 4,000 records, s", big["filter"] / 1000, f"<= {FILTER_S:g}",
                    big["filter"] / 1000 <= FILTER_S)],
        notes=[f"empty page in the same browser: first view {floor['ready']:.0f} ms, first paint {floor['fcp']:.0f} ms",
               f"paper run: {baseline}; the 4,000-record run is synthesised from it ({n_synth:,} records: "
               f"{REASKED} queries re-asked, a second model = the runs shifted by one), rendered in {synth_s:.0f} s",
               "build s: the `view` command's Python work (read the folder, shape, write the page); browser figures are medians of "
               f"{LOADS} loads from file://; the machine's load average is in the header"],
        data=data | {"empty_page_ms": floor},
    )


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.view", description=TITLE)
    ap.add_argument("--baseline", type=Path, default=BASELINE, help="a finished `--model sim --runs 4` output folder")
    args = ap.parse_args()
    st = Stamp()
    t0 = time.perf_counter()
    res = run(args.baseline)
    print(f"wrote {finish(res, t0, st, 'bench.view')}")


if __name__ == "__main__":
    main()
