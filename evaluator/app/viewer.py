"""The viewer's use case: an output folder's values gathered through `OutputDir`, the page made by `render.view_page`
and written beside them (with its parts, each file atomic); the `view` command's page of one or several folders.
Serving it is `cli.view_server`'s."""

from __future__ import annotations

import dataclasses
import functools
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from evaluator.analysis import compare
from evaluator.analysis.stats import Checks, Row, Summary, Test
from evaluator.app.memo import Memo
from evaluator.core.errors import OutputError
from evaluator.core.files import atomic_write
from evaluator.core.redact import scrub
from evaluator.render.view_page import (
    PART_RECORDS,
    VIEW_FILE,
    Assets,
    Source,
    datasets,
    html,
    paged,
    parts_folder,
    sides,
    split_in_memory,
)
from evaluator.results.schema import SUMMARY_FILE, Meta, OutputDir, Record
from evaluator.results.stream import SavedRecords, records_of

_COMPARISON = TypeAdapter(compare.Comparison)
_TESTS = TypeAdapter(list[Test])
_ROWS = TypeAdapter(list[Row])
_CHECKS = TypeAdapter(Checks)


@functools.cache
def assets() -> Assets:
    """The viewer's script and style sheet, shipped in `evaluator/render/view_assets/`."""
    folder = resources.files("evaluator.render").joinpath("view_assets")
    return Assets(js=folder.joinpath("view.js").read_text(encoding="utf-8"),
                  css=folder.joinpath("view.css").read_text(encoding="utf-8"))


def saved_summary(summary: Mapping[str, Any] | None) -> Summary | None:
    """summary.json's rows, tests and checks, typed (as `migrate.summary` returns the file)."""
    if not summary:
        return None
    return Summary(_ROWS.validate_python(summary.get("rows") or []), _TESTS.validate_python(summary.get("tests") or []),
                   _CHECKS.validate_python(summary.get("checks") or {}))


def saved_comparison(summary: Mapping[str, Any] | None, k: int) -> compare.Comparison | None:
    """The architectures' comparison summary.json keeps (three or more), else the paper's RtP-vs-PtR Wilcoxon
    tests as the one pair (`analysis.compare.from_paper_tests`)."""
    if not summary:
        return None
    if summary.get("comparisons") is not None:
        return _COMPARISON.validate_python(summary["comparisons"])
    return compare.from_paper_tests(_TESTS.validate_python(summary.get("tests") or []), k)


def source(od: OutputDir, name: str | None = None, *, meta: Meta | None = None,
           records: Sequence[Record] | None = None, figures: Sequence[str] | None = None) -> Source:
    """One output folder's values (the ones already read may be passed in; `figures`: the names a render drew,
    so a stale PNG left in the folder is not shown); its summary.json read back, as the report's tables."""
    od.require()
    saved = meta is None or records is None
    meta = meta if meta is not None else od.read_meta()
    records = records if records is not None else records_of(od)
    if saved:
        od.check_agree(meta, records)  # another run's meta.json is not shown over these records
    summary = od.read_json(SUMMARY_FILE)
    return Source(name or od.path.name or str(od.path), meta, records, saved_summary(summary),
                  dict((summary or {}).get("meta") or {}), od.read_figures(figures), saved_comparison(summary, meta.k))


def write(od: OutputDir, meta: Meta, records: Sequence[Record], figures: Sequence[str] | None,
          part_records: int = PART_RECORDS, kept: Memo | None = None) -> None:
    """`OUT/view.html` of one output folder (the hook at the end of `report` and of a study), with its parts.
    `kept`: the records' page data read back when these records were shown before (app.memo)."""
    write_paged(od.path / VIEW_FILE, [source(od, meta=meta, records=records, figures=figures)],
                part_records=part_records, kept=kept)


def write_page(folders: Sequence[OutputDir], out: Path | None = None,
               part_records: int = PART_RECORDS) -> tuple[Path, str]:
    """The `view` command: one folder's `view.html`, or a comparison page at `out`. Returns its path and text."""
    names = [od.path.name or str(od.path) for od in folders]
    # two folders of the same name (a/out, b/out) are told apart by the path as given
    names = [str(od.path) if names.count(n) > 1 else n for od, n in zip(folders, names, strict=True)]
    page = folders[0].path / VIEW_FILE if out is None else out
    return page, write_paged(page, [source(od, n) for od, n in zip(folders, names, strict=True)],
                             part_records=part_records)


def split_streamed(sources: Sequence[Source], plan: dict[compare.QueryKey, int]) -> Iterator[list[Source]]:
    """`render.view_page.split_in_memory` for records too many to hold (a stream over queries.jsonl,
    `SavedRecords`): one pass notes each record's position under its part, then each part's records are read
    back alone from queries.jsonl."""
    parts = max(plan.values(), default=-1) + 1
    where: list[list[array[int]]] = [[array("q") for _ in sources] for _ in range(parts)]
    for ds, src in enumerate(sources):
        for i, r in enumerate(src.records):
            where[plan[compare.query_key(r)]][ds].append(i)
    for spots in where:
        yield [dataclasses.replace(src, records=src.records.take(at) if isinstance(src.records, SavedRecords)
                                   else [src.records[i] for i in at], figures={})
               for src, at in zip(sources, spots, strict=True)]


def _kept_page(sources: Sequence[Source], page_name: str, part_records: int, kept: Memo,
               emit: Callable[[str, str], None]) -> dict[str, Any]:
    """`paged`'s data and parts for the records of `kept` (one folder's, held in memory), computed once per
    change of them (bench/README.md, "app/viewer.py"); every part is emitted again and `datasets` made anew,
    in its place."""
    def make() -> tuple[dict[str, Any], list[tuple[str, str]]]:
        parts: list[tuple[str, str]] = []
        data = paged(sources, page_name, lambda name, body: parts.append((name, body)), runs_compared(sources),
                     part_records)
        return {key: [] if key == "datasets" else value for key, value in data.items()}, parts  # made anew

    (data, parts), _ = kept.kept("view", {"page": page_name, "part_records": part_records, "sides": sides(sources),
                                          "study": sources[0].meta.study_view()}, make)
    for name, body in parts:
        emit(name, body)
    return {key: datasets(sources) if key == "datasets" else value for key, value in data.items()}


def runs_compared(sources: Sequence[Source]) -> compare.RunsComparison | None:
    """Every side of the page (output folder x model) against the first (`analysis.compare.runs`); a page of
    sides with no query in common is one line, before anything is written."""
    page_sides = sides(sources)
    runs = compare.runs([(_of_model(sources[s["ds"]].records, s["model"]), sources[s["ds"]].meta.k)
                         for s in page_sides])
    if runs is not None and not any(p.shared for p in runs.pairs):
        names = " and ".join(s["label"] for s in page_sides)
        raise OutputError(f"{names} have no query in common (same subset and query id); "
                          "compare runs of the same query files.")
    return runs


def _of_model(records: Sequence[Record], model: str | None) -> Iterator[Record]:
    """One side's records: those of its model (a function, so each side keeps its own model: a generator
    expression in a loop reads the loop's variable when it runs, the last side's)."""
    return (r for r in records if r.model == model)


def write_paged(page: Path, sources: Sequence[Source], title: str | None = None,
                part_records: int = PART_RECORDS, kept: Memo | None = None) -> str:
    """A page and its parts, each file atomic and each part written as soon as it is made; the parts come
    first (the page names them), and parts of an earlier, larger page are removed, so the folder holds exactly
    what the page loads. Returns the page's text. `kept` (one output folder's page, its records held in
    memory): the records' page data and parts read back when these records were shown so before; only each
    folder's own `datasets` (name, accounting, figures...) are made again."""
    folder = page.parent / parts_folder(page.name)
    written: set[str] = set()

    def emit(name: str, body: str) -> None:
        atomic_write(folder / name, scrub(body))  # the records' texts: a plugin's trace may hold a key
        written.add(name)

    streamed = any(isinstance(src.records, SavedRecords) for src in sources)
    if kept is not None and len(sources) == 1 and not streamed:
        data = _kept_page(sources, page.name, part_records, kept, emit)
    else:
        data = paged(sources, page.name, emit, runs_compared(sources), part_records,
                     split_streamed if streamed else split_in_memory)
    text = html(sources, data, assets(), title)
    if folder.is_dir():
        for old in folder.glob("part-*.js"):
            if old.name not in written:
                old.unlink()
        if not any(folder.iterdir()):
            folder.rmdir()
    text = scrub(text)
    atomic_write(page, text)
    return text
