"""Rendering a finished output folder again, and the analyses alone on its saved data: `report`, `scaling`,
`routing`, `export trec`. No LLM call, no network."""


from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluator.analysis import compare, routing_study, scaling_study
from evaluator.analysis.main_study import main_study
from evaluator.analysis.stats import summary_dict
from evaluator.app import figure_store, viewer
from evaluator.app.memo import Memo
from evaluator.core.errors import ConfigError, DataError, OutputError
from evaluator.core.paths import resolve_path
from evaluator.core.progress import SILENT, Reporter
from evaluator.data import load_registry
from evaluator.render import charts, report_md, routing_section, scaling_section, trec
from evaluator.results.schema import (
    REPORT_FILE,
    ROUTING_FILE,
    SCALING_FILE,
    SUMMARY_FILE,
    About,
    Meta,
    OutputDir,
    Record,
    check_writable,
)
from evaluator.results.stream import in_key_order, records_of
from evaluator.retrieval.index import searches_folder
from evaluator.retrieval.lexical import load_index
from evaluator.settings.sections import AnalysisSettings, EmbedSettings, Settings
from evaluator.settings.subsets import AnalysisSubsets, analysis_subsets
from evaluator.study.prepare import make_embedder


def about(meta: Meta, a: AnalysisSettings, setting: str) -> About:
    derived = not getattr(a, setting)
    return meta.about(
        "derived from the subsets present: sorted, the last one is the held-out test set" if derived
        else "as set in [analysis]",
        "derived: the last subset in sorted order is the test set, the others tune" if derived
        else "as set in [analysis]")


def render_outputs(od: OutputDir, *, with_figures: bool = True, store_dir: Path | None = None,
                   meta: Meta | None = None, records: Sequence[Record] | None = None, kept: Memo | None = None) -> None:
    """`summary.json`, figures and `report.md` from the saved data alone (no LLM, no network).
    `store_dir`: a folder of figures already drawn, by their data (app.figure_store.drawn). `meta`,
    `records`: what the study just wrote there, so it is not read back (bench/README.md, "app/outputs.py").
    Records past `stream.held()` are a stream over queries.jsonl (`SavedRecords`): every analysis passes over them. `kept`:
    the main study's result read back when these records and this study were analysed before (app.memo)."""
    saved = meta is None or records is None  # read back: another run's meta.json may sit beside the records
    meta = od.read_meta() if meta is None else meta
    records = records_of(od) if records is None else in_key_order(records)
    if saved:
        od.check_agree(meta, records)
    study = meta  # (a name for the closure: mypy keeps the narrowed types)
    rows = records
    result = main_study(records, meta) if kept is None else \
        kept.kept("main_study", {"study": meta.study_view()}, lambda: main_study(rows, study))[0]
    comparisons = compare.comparison_dict(result.comparison) if result.comparison is not None else None  # 3+ archs
    od.write_json(SUMMARY_FILE, summary_dict(result.summary, meta.study_view(), comparisons), indent=1)
    scaling = od.read_json(SCALING_FILE)
    routing = od.read_json(ROUTING_FILE)
    sections: list[str] = []
    skipped: list[str] = []
    figs: list[Path] = []  # the main study's figures (report.md lists them); the analyses' sit in their sections
    if with_figures:
        simulated = report_md.labels_of(meta, result.summary.models).simulated
        inputs = {"rows": [dataclasses.asdict(r) for r in result.summary.rows], "k": result.k, "ks": list(result.ks),
                  "simulated": sorted(simulated)}
        figs = figure_store.drawn(od.figures, "summary", inputs, functools.partial(
            charts.summary_figures, result.summary, k=result.k, ks=result.ks, simulated=simulated), store_dir)
    drawn = list(figs)  # every figure this render drew: the view shows these, not a stale PNG of an earlier run
    # The two analyses that follow the main study: (name, saved data, its typed result, section, figure, command)
    analyses: tuple[tuple[str, dict[str, Any] | None, Callable[[Mapping[str, Any]], Any], Callable[[Any], str],
                          Callable[[Any], bytes], str], ...] = (
        ("scaling", scaling, scaling_study.ScalingResult.from_dict, scaling_section.section_md,
         scaling_section.figure, "Scaling study (Table 10)"),
        ("routing", routing, routing_study.RoutingResult.from_dict, routing_section.section_md,
         routing_section.figure, "Routing study"),
    )
    for name, data, typed, section_md, draw, title in analyses:
        if data is None:
            if not meta.retrieval_only:
                skipped.append(f"{title}: {meta.analysis_notes.get(name, 'not run')}; "
                               f"`python -m evaluator {name} OUT` runs it from the saved data.")
            continue
        try:
            res = typed(data)
        except (KeyError, TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
            raise OutputError(f"{od.path / f'{name}.json'}: not a {name} result ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:160]}); rerun `python -m evaluator {name} OUT`.") from None
        sections.append(section_md(res))
        if isinstance(res, routing_study.RoutingResult) and not res.meta.has_split:
            skipped.append("Routing held-out subset split: it needs two subsets, one to tune τ on and one to "
                           "report on; cross-validation is shown instead.")
        if with_figures:
            drawn += figure_store.drawn(od.figures, name, figure_store.figure_inputs(data),
                                        functools.partial(_one_figure, f"{name}.png", draw, res), store_dir)
    od.write_text(REPORT_FILE, report_md.compose(meta, result, sections=sections, figures=[p.name for p in figs],
                                          skipped=skipped))
    # view.html: every query browsable (app.viewer)
    viewer.write(od, meta, records, [p.name for p in drawn] if with_figures else None, kept=kept)


def _one_figure(name: str, draw: Callable[[Any], bytes], result: Any) -> dict[str, bytes]:
    return {name: draw(result)}


def _records_with_ptr(od: OutputDir, what: str) -> Sequence[Record]:
    records = records_of(od)
    if not any(r.ptr is not None and r.model is not None for r in records):
        raise DataError(f"{od.path}: no PtR records (a retrieval-only run?); {what} needs both architectures.")
    return records


def scaling_from_output(od: OutputDir, s: Settings, *, data_dir: str | None = None, device: str = "auto",
                        reporter: Reporter = SILENT) -> scaling_study.ScalingResult:
    """The scaling study on a finished run: its registry re-read, every vector from its embedding cache."""
    meta = od.read_meta()
    records = records_of(od)
    od.check_agree(meta, records)
    # --data on this command wins; else the run's --tools, else its data folder
    data = data_dir or meta.settings.data.tools or meta.data_dir or meta.settings.data.dir
    if not data:
        raise DataError(f"{od.path}/meta.json names no data_dir; pass --data DIR.")
    registry = load_registry(data, meta.registry.choice if meta.registry.choice != "?" else "full",
                             fmt=meta.settings.data.tools_format)
    if meta.registry.size and meta.registry.size != len(registry):
        reporter.warn(f"the registry now has {len(registry):,} APIs, the run had {meta.registry.size:,}")
    embed = EmbedSettings(model=meta.settings.embed.model,
                          precision=meta.precision if meta.precision != "?" else "auto", device=device,
                          # old runs had only torch; the cache key is model/backend/precision
                          backend=meta.backend if meta.backend != "?" else "torch",
                          batch_size=s.embed.batch_size)
    embedder = make_embedder(embed, resolve_path(s.run.cache_dir), reporter.progress, reporter)
    encode = lambda texts: embedder.encode(texts, desc="embedding (cache misses)")  # noqa: E731
    api_vecs = encode(registry.texts())
    a = s.analysis
    subs = analysis_subsets(a, sorted({r.subset for r in records}))
    retriever = meta.settings.retrieval.retriever
    lexical = load_index(registry.texts(), embedder.cache_dir, reporter.warn)[0] if retriever != "dense" else None
    res = scaling_study.scaling_study(records, registry, api_vecs, encode, subsets=subs.scaling,
                           divergence_subset=subs.divergence, k=s.retrieval.k, sizes=list(a.scaling_sizes),
                           seeds=a.scaling_seeds, about=about(meta, a, "scaling_subsets"), log=reporter.info,
                           memo=searches_folder(embedder.cache_dir), retriever=retriever, lexical=lexical)
    if meta.registry.digest and meta.registry.digest != registry.digest():
        reporter.warn(f"the registry at {data} is not the one the run used (digest {registry.digest()}, the run's "
                      f"{meta.registry.digest}); the scaling study uses it as it is now")
    res.meta.embed = dataclasses.asdict(embedder.stats)
    if embedder.stats.embedded:
        reporter.info(f"note: {embedder.stats.embedded} texts were not in the embedding cache and were embedded now")
    od.write_json(SCALING_FILE, res.to_dict())
    render_outputs(od)
    return res


def routing_from_output(od: OutputDir, s: Settings, reporter: Reporter = SILENT) -> routing_study.RoutingResult:
    meta = od.read_meta()
    saved = max([meta.k, *meta.ks])
    k = s.retrieval.k
    if k > saved:  # the records hold each top list only to the run's largest k
        raise ConfigError(f"--k {k} is above the largest k this run saved ({saved}); pass --k {saved} or less.")
    records = _records_with_ptr(od, "routing")
    od.check_agree(meta, records)
    subs = analysis_subsets(s.analysis, sorted({r.subset for r in records}))
    opt = routing_options(k, s.analysis, subs)
    res = routing_study.routing_study(records, opt, about(meta, s.analysis, "routing_test"), log=reporter.info)
    od.write_json(ROUTING_FILE, res.to_dict())
    render_outputs(od)
    return res


def export_trec(od: OutputDir, to: Path, bare_qids: bool = False) -> list[Path]:
    """`export trec OUT --to DIR`: the run's ranked lists and gold sets as TREC run and qrels files (`bare_qids`:
    qid = the query id alone, refused in one line when two subsets share an id)."""
    records = records_of(od)
    if bare_qids and (shared := trec.shared_qids(records)) is not None:
        q, a, b = shared
        raise OutputError(f"--bare-qids: query id {q!r} is in subsets {a!r} and {b!r}, so a qid without its subset "
                          "would name two queries; export without --bare-qids (qid = <subset>/<query_id>).")
    check_writable(to, "--to")
    target = OutputDir(to)
    written = []
    for name, text in trec.export(records, bare_qids).items():
        target.write_text(name, text)
        written.append(to / name)
    return written


def routing_options(k: int, a: AnalysisSettings, subs: AnalysisSubsets) -> routing_study.Options:
    return routing_study.Options(k=k, train=subs.routing_train, test=subs.routing_test,
                                    folds=a.routing_folds, seed=a.routing_seed)
