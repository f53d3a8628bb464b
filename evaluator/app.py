"""The application: prepare → run models → write outputs → analyses → render.

Knows the order of the stages and the output folder; knows nothing of argparse or exit codes (see
`cli`). Every check that can fail on a user's input runs before embedding or any LLM call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from . import __version__
from .analysis import routing as routing_analysis
from .analysis import scaling as scaling_analysis
from .analysis.main import main_study
from .analysis.stats import summary_dict
from .batch import study as batch_study
from .batch.cost import BatchStats, accounting
from .batch.files import Result, read_requests, write_lines
from .batch.ray_engine import RayOptions, RayRun, run_requests_ray
from .batch.ray_engine import check as check_ray
from .batch.requests import offline_profile, run_requests
from .batch.store import JobStore
from .config import AnalysisSubsets, ConfigError, Settings, analysis_subsets
from .core import aio
from .core.cache_layout import CacheLayout
from .core.progress import SILENT, Progress, Reporter
from .data import DataError, Registry, load_registry
from .index import searches_folder
from .lexical import BM25Index, load_index
from .llamacpp import harness as llamacpp
from .llm import LLMEngine, ModelProfile, load_profile
from .llm.accounting import CallStats
from .llm.budget import Budget, check_priced
from .llm.engine import STOP_GRACE_S
from .llm.errors import BudgetExhausted
from .llm.limits import SharedRates, rate_folder
from .pipeline import StudyRunner, Unit, calls_per_unit, retrieval_only_records
from .plan import PLAN_FILE, plan_requests, plan_study, write_plan
from .render import figures, report, trec, view
from .render import routing as routing_render
from .render import scaling as scaling_render
from .retrievers import Hybrid, Lexical
from .schema import (
    REPORT_FILE,
    ROUTING_FILE,
    SCALING_FILE,
    SUMMARY_FILE,
    About,
    LocalServer,
    Meta,
    ModelInfo,
    OutputDir,
    OutputError,
    PeakMemory,
    Record,
    RegistryInfo,
    Runtime,
    SimulatorStats,
    check_writable,
    record_key,
)
from .sim.harness import SimHandle, start_simulator
from .study import Inputs, Study, load_inputs, make_embedder, prepare

Log = Callable[[str], None]


@dataclass
class RunOutcome:
    out: Path
    failed: Counter[str] = field(default_factory=Counter)  # calls that failed for good, per error kind
    cut: Counter[str] = field(default_factory=Counter)  # replies in the results that were cut short, per cause
    usage_estimated: int = 0  # fresh replies whose body had no usage: tokens (and cost) estimated
    message: str = ""  # set when the invocation did something else than a study (--batch-cancel)


# ---------------------------------------------------------------- checks before any work


def output_path(s: Settings) -> Path:
    return Path(s.out) if s.out else Path("results") / time.strftime("%Y%m%d-%H%M%S")


def load_profiles(s: Settings, *, offline: bool = False) -> dict[str, ModelProfile]:
    """Every profile resolved and checked (types, keys present) before any work starts.

    `offline`: for building cache keys only (request export): no key needed, no endpoint contacted."""
    profiles: dict[str, ModelProfile] = {}
    for name in dict.fromkeys(s.models):
        p = offline_profile(name, **s.overrides.as_kwargs()) if offline else load_profile(name, **s.overrides.as_kwargs())
        if p.name in profiles:
            raise ConfigError(f"two models are both named {p.name!r}; give each profile its own name")
        if p.local_model and not p.base_url and not offline:
            llamacpp.check(p, s.resolve_path(s.cache_dir))  # server and weights installed: one line now
        profiles[p.name] = p
    return profiles


def check_inputs(s: Settings, inputs: Inputs) -> None:
    """After the data is loaded, before embedding: budgets the registry can serve, and some queries."""
    n = len(inputs.registry)
    if s.k > n:
        raise ConfigError(f"--k {s.k} is above the registry's {n:,} APIs; pass --k {n} or less.")
    too_big = sorted(k for k in set(s.ks) if k > n)
    if too_big and "ks" in s.cli_keys:
        raise ConfigError(f"--ks {','.join(map(str, too_big))} above the registry's {n:,} APIs; "
                          f"pass --ks with values up to {n}.")
    if not inputs.queries:
        what = f"subsets {','.join(s.subsets)}" if s.subsets else "the query files"
        raise DataError(f"no queries to run: {what} in {inputs.data_dir or ', '.join(s.queries)} gave none"
                        + (f" (--limit {s.limit})" if s.limit else "") + "; check --subsets and the data folder.")


def checked_inputs(s: Settings, reporter: Reporter, *, analyses: bool = False) -> Inputs:
    """The data loaded and every check on it passed (and the config's ablation budgets fitted), before
    anything is embedded. `analyses`: an [analysis] subset the data lacks is one line now, not after
    the LLM phase."""
    inputs = load_inputs(s)
    check_inputs(s, inputs)
    warn_data(inputs, reporter)
    if analyses:
        analysis_subsets(s, sorted({q.subset for q in inputs.queries}))
    fit_ks_to_registry(s, inputs.registry, reporter.info)
    return inputs


def warn_data(inputs: Inputs, reporter: Reporter) -> None:
    """Every counted data problem as one line on stderr too, not only in the report's "Data warnings"."""
    for kind, n in sorted(inputs.warnings.counts.items()):
        example = (inputs.warnings.examples.get(kind) or [""])[0]
        reporter.warn(f"data: {n:,} {kind} (e.g. {example[:200]}); all listed under Data warnings in report.md")


def fit_ks_to_registry(s: Settings, registry: Registry, log: Log) -> None:
    """Config-file ablation budgets above a small registry are dropped (with a note); flags are not:
    `check_inputs` rejects those."""
    n = len(registry)
    if "ks" not in s.cli_keys and any(k > n for k in s.ks):
        dropped = sorted(k for k in set(s.ks) if k > n)
        s.ks = [k for k in s.ks if k <= n] or [min(s.k, n)]
        log(f"note: k-ablation values {','.join(map(str, dropped))} from the config are above the registry's "
            f"{n} APIs; left out")


# ---------------------------------------------------------------- the run


def run(s: Settings, *, reporter: Reporter = SILENT, retrieval_only: bool = False) -> RunOutcome:
    out = output_path(s)
    cache_root = s.resolve_path(s.cache_dir)
    check_writable(cache_root, "--cache-dir")
    check_writable(out, "--out")
    profiles = {} if retrieval_only else load_profiles(s, offline=s.dry_run)
    if s.budget_usd is not None and profiles and not s.dry_run:
        check_priced(profiles)  # a budget needs prices and max_tokens: one line, before any work
    if s.batch and profiles:
        batch_study.check(profiles)  # a profile without a batch API: one line, before any work
        if s.batch == "cancel":
            if s.dry_run:  # a dry run sends nothing, and cancelling is a request
                raise ConfigError("--dry-run and --batch-cancel do not go together: drop one of them.")
            stats = batch_study.cancel(profiles, cache_root, reporter.info)
            return RunOutcome(out, message=batch_study.cancel_message(stats))
    with contextlib.ExitStack() as stack:
        # Simulated and bundled models' servers start now and get ready beside the loading and embedding below.
        sims = _start_servers(stack, profiles, cache_root) if profiles and not s.dry_run else {}
        return _run_study(s, out, cache_root, profiles, sims, reporter, retrieval_only)


def _run_study(s: Settings, out: Path, cache_root: Path, profiles: dict[str, ModelProfile],
               sims: dict[str, Server], reporter: Reporter, retrieval_only: bool) -> RunOutcome:
    inputs = checked_inputs(s, reporter, analyses=not retrieval_only and s.extras)
    study = prepare(s, reporter.progress, inputs, reporter=reporter)
    if s.dry_run and profiles:  # --dry-run: the plan of the LLM phase; nothing is sent
        return RunOutcome(out, message=write_plan(plan_study(study, profiles, cache_root), out / PLAN_FILE))
    od = OutputDir(out)
    if retrieval_only:
        records = retrieval_only_records(study)
        meta = build_meta(study, {})
    else:
        # meta states the profiles as declared: an auto-started simulator's port is an accident of this run
        budget = Budget(s.budget_usd) if s.budget_usd is not None else None
        try:
            records, llm_stats, sim_stats, batch_stats = run_models(study, dict(profiles), cache_root, reporter,
                                                                    budget=budget, sims=sims)
        except BudgetExhausted:  # what remains, priced from the cache now holding every reply received
            assert budget is not None
            rest = plan_study(study, profiles, cache_root)
            raise BudgetExhausted(f"{budget.stop_message()} {rest.remaining()}") from None
        meta = build_meta(study, profiles)
        meta.llm_stats = llm_stats
        meta.runtime.simulator_stats = {n: v for n, v in sim_stats.items() if isinstance(v, SimulatorStats)}
        local = {n: v for n, v in sim_stats.items() if isinstance(v, LocalServer)}
        if local:  # the bundled model's file, hash, server version, threads, slots and counters
            meta.runtime.local_server = local
        meta.batch = batch_stats
        meta.cost = {n: accounting(p, meta.llm_stats.get(n), meta.batch.get(n)) for n, p in profiles.items()}
    od.write_meta(meta)
    od.write_records(records)
    if not retrieval_only:
        notes = run_extras(s, study, records, meta, od, reporter)
        meta.analysis_notes = notes
        od.write_meta(meta)
    meta.runtime.peak_rss_mib = peak_rss_mib()  # before the report, which states it
    t = time.perf_counter()
    render_outputs(od, figure_store=CacheLayout(cache_root).figures, meta=meta, records=records)
    study.timings["render_s"] = time.perf_counter() - t
    meta.runtime.timings = study.timings  # every stage's seconds (bench/warm_run.py reads them)
    od.write_meta(meta)
    failed: Counter[str] = Counter(kind for r in records for kind in r.failed_calls)
    cut: Counter[str] = Counter(c for r in records for b in (r.rtp, r.ptr) if b is not None for c in b.cut_replies())
    estimated = sum(st.usage_estimated for st in meta.llm_stats.values())
    return RunOutcome(out, failed, cut=cut, usage_estimated=estimated)


def peak_rss_mib() -> PeakMemory:
    """Peak resident memory so far (getrusage's ru_maxrss): of this process, of its largest finished
    child (the model export runs in one) and the larger of the two."""
    scale = 2**20 if sys.platform == "darwin" else 2**10  # bytes on macOS, KiB on Linux
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale / 2**20
    return PeakMemory(largest_process=round(max(own, child), 1), this_process=round(own, 1),
                      largest_child=round(child, 1))


Server = SimHandle | llamacpp.LlamaHandle  # a server this process started for a profile: base_url, stats(), stop()


def _start_servers(stack: contextlib.ExitStack, profiles: dict[str, ModelProfile], cache_root: Path) -> dict[str, Server]:
    """A local simulator for each simulated profile without an endpoint, and the bundled llama.cpp server for
    each profile with `local_model` and no endpoint, started without waiting for them (`_use_servers`
    waits); they stop with `stack` (an error, Ctrl-C, SIGTERM) or at the end of the LLM stage."""
    out: dict[str, Server] = {}
    for name, p in profiles.items():
        if p.simulated and not p.base_url:
            out[name] = stack.enter_context(start_simulator(wait=False))
        elif p.local_model and not p.base_url:
            out[name] = stack.enter_context(llamacpp.start_llamacpp(p, cache_root))
    return out


def _use_servers(profiles: dict[str, ModelProfile], sims: dict[str, Server]) -> None:
    """Each profile pointed at the server started for it (`profiles` updated in place), once it listens."""
    for name, sim in sims.items():
        if isinstance(sim, llamacpp.LlamaHandle):
            profiles[name] = llamacpp.use(profiles[name], sim)
        else:
            profiles[name] = dataclasses.replace(profiles[name], base_url=sim.base_url)


def run_models(study: Study, profiles: dict[str, ModelProfile], cache_root: Path, reporter: Reporter = SILENT, *,
               budget: Budget | None = None, sims: dict[str, Server] | None = None,
               ) -> tuple[list[Record], dict[str, CallStats], dict[str, SimulatorStats | LocalServer],
                          dict[str, BatchStats]]:
    """Every (model, run) of the study; simulated profiles without an endpoint get a local simulator and
    bundled models (`local_model`) their llama.cpp server (`sims`: ones already started for them), stopped
    when the stage ends. With `--batch`, the calls first go through the batch APIs; the run then answers
    them from the cache."""
    s = study.settings
    with contextlib.ExitStack() as stack:
        sims = sims if sims is not None else _start_servers(stack, profiles, cache_root)
        _use_servers(profiles, sims)
        batch_stats: dict[str, BatchStats] = {}
        if s.batch == "submit":
            batch_stats = batch_study.run_batch(study, profiles, cache_root, log=reporter.info, budget=budget,
                                                warn=reporter.warn, fallback=s.batch_fallback)
        per_unit = calls_per_unit(study) * s.runs
        bar = reporter.calls({n: per_unit for n in profiles})
        t = time.perf_counter()
        with bar:
            records, llm_stats = aio.run(_run_async(study, profiles, cache_root, bar, budget))
        study.timings["llm_s"] = time.perf_counter() - t
        # The simulator's own count of what it answered (a rerun from the cache shows zero requests); the
        # llama.cpp server's file, hash, sizing and token counters.
        sim_stats: dict[str, SimulatorStats | LocalServer] = {
            n: LocalServer(**sim.stats()) if isinstance(sim, llamacpp.LlamaHandle) else SimulatorStats.from_dict(sim.stats())
            for n, sim in sims.items()}
        for sim in sims.values():
            sim.stop()  # idle from here on: the analyses and the render need none
    return records, llm_stats, sim_stats, batch_stats


async def _run_async(study: Study, profiles: dict[str, ModelProfile], cache_root: Path,
                     bar: Progress, budget: Budget | None = None) -> tuple[list[Record], dict[str, CallStats]]:
    s = study.settings
    # one RPM per key for every process on this folder (the cache's, or --rate-dir)
    rates = SharedRates(rate_folder(s.resolve_path(s.rate_dir) if s.rate_dir else None, cache_root))
    async with contextlib.AsyncExitStack() as stack:
        engines = {n: await stack.enter_async_context(LLMEngine(p, cache_root=cache_root, budget=budget,
                                                                grace_s=s.stop_grace_s,
                                                                pacer_factory=rates, token_pacer_factory=rates.tpm)) for n, p in profiles.items()}
        for n, e in engines.items():
            bar.attach(n, e.stats)
        runner = StudyRunner(study, engines, bar)
        units = [Unit(m, r) for m in profiles for r in range(study.settings.runs)]
        try:
            await runner.run(units)
        finally:
            stats = {n: e.stats.summary() for n, e in engines.items()}
    return runner.records, stats


# meta.json states the settings and each profile as saved (their JSON shape, secrets and per-invocation
# fields left out), read back into their types
_SETTINGS = TypeAdapter(Settings)
_PROFILE = TypeAdapter(ModelProfile)


def build_meta(study: Study, profiles: dict[str, ModelProfile]) -> Meta:
    s = study.settings
    return Meta(
        version=__version__, settings=_SETTINGS.validate_python(s.study_dict()), data_dir=str(study.data_dir or ""),
        embedder=study.embedder.cache_name, precision=study.embedder.precision, backend=study.embedder.backend,
        registry=RegistryInfo(s.registry, len(study.registry), study.registry.source, study.registry.format,
                              study.registry.digest()),
        subsets=study.subsets, k=s.k, ks=sorted(set(s.ks)), runs=s.runs if profiles else 1,
        models=[ModelInfo(n, p.model, p.simulated, _PROFILE.validate_python(p.request_settings()))
                for n, p in profiles.items()],
        retrieval_only=not profiles, warnings=study.warnings.as_dict(),
        # Everything that changes from one invocation to the next lives here and stays out of summary.json.
        runtime=Runtime(created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), timings=study.timings,
                        embed=dataclasses.asdict(study.embedder.stats), embed_runtime=study.embedder.description),
    )


# ---------------------------------------------------------------- analyses beside the main study


def run_extras(s: Settings, study: Study, records: list[Record], meta: Meta, od: OutputDir,
               reporter: Reporter = SILENT) -> dict[str, str]:
    """Scaling and routing, reusing this run's embeddings and records; returns why any did not run."""
    if not s.extras:
        return {"scaling": "not run (--no-extras)", "routing": "not run (--no-extras)"}
    if set(s.archs) != {"rtp", "ptr"}:
        why = f"needs both architectures; this run had only {', '.join(s.archs)}"
        return {"scaling": why, "routing": why}
    notes: dict[str, str] = {}
    subs = analysis_subsets(s, sorted(study.subsets))
    quiet: Log = reporter.info if reporter.progress else (lambda _m: None)
    t = time.perf_counter()
    if subs.scaling:
        res = scaling_analysis.scaling_study(
            records, study.registry, study.api_vecs, lambda texts: study.embedder.encode(texts, progress=False),
            subsets=subs.scaling, divergence_subset=subs.divergence, k=s.k, sizes=s.scaling_sizes,
            seeds=s.scaling_seeds, about=_about(meta, s, "scaling_subsets"), log=quiet,
            memo=searches_folder(study.embedder.cache_dir), retriever=s.retriever, lexical=_lexical(study.retriever))
        od.write_json(SCALING_FILE, res.to_dict())
    else:
        notes["scaling"] = "no subset to run it on"
    study.timings["scaling_s"] = time.perf_counter() - t
    t = time.perf_counter()
    opt = _routing_options(s, subs)
    result = routing_analysis.routing_study(records, opt, _about(meta, s, "routing_test"))
    od.write_json(ROUTING_FILE, result.to_dict())
    study.timings["routing_s"] = time.perf_counter() - t
    return notes


def _lexical(retriever: object) -> BM25Index | None:
    """The BM25 index a bm25 / hybrid retriever searches (the scaling study filters its scores)."""
    if isinstance(retriever, Hybrid):
        retriever = retriever.lexical
    return retriever.index if isinstance(retriever, Lexical) else None


def _routing_options(s: Settings, subs: AnalysisSubsets) -> routing_analysis.Options:
    return routing_analysis.Options(k=s.k, train=subs.routing_train, test=subs.routing_test,
                                    folds=s.routing_folds, seed=s.routing_seed)


def _about(meta: Meta, s: Settings, setting: str) -> About:
    derived = not getattr(s, setting)
    return meta.about(
        "derived from the subsets present: sorted, the last one is the held-out test set" if derived
        else "as set in [analysis]",
        "derived: the last subset in sorted order is the test set, the others tune" if derived
        else "as set in [analysis]")


# ---------------------------------------------------------------- render


def _draw_one(draw: Callable[[Any, Path], Path], result: Any, png: Path) -> list[Path]:
    return [draw(result, png)]


def render_outputs(od: OutputDir, *, with_figures: bool = True, figure_store: Path | None = None,
                   meta: Meta | None = None, records: list[Record] | None = None) -> None:
    """`summary.json`, figures and `report.md` from the saved data alone (no LLM, no network).
    `figure_store`: a folder of figures already drawn, by their data (render.figures.drawn). `meta`,
    `records`: what the run just wrote there, so it is not read back (0.5 s of a warm study)."""
    saved = meta is None or records is None  # read back: another run's meta.json may sit beside the records
    meta = od.read_meta() if meta is None else meta
    records = od.read_records() if records is None else sorted(records, key=record_key)
    if saved:
        od.check_agree(meta, records)
    result = main_study(records, meta)
    od.write_json(SUMMARY_FILE, summary_dict(result.summary, meta.study_view()), indent=1)
    scaling = od.read_json(SCALING_FILE)
    routing = od.read_json(ROUTING_FILE)
    sections: list[str] = []
    skipped: list[str] = []
    figs: list[Path] = []  # the main study's figures (report.md lists them); the analyses' sit in their sections
    if with_figures:
        figs = figures.render_figures(od.figures, result.summary, k=result.k, ks=result.ks,
                                simulated=report.labels_of(meta, result.summary.models).simulated, store=figure_store)
    drawn = list(figs)  # every figure this render drew: the view shows these, not a stale PNG of an earlier run
    # The two analyses that follow the main study: (name, saved data, its typed result, section, figure, command)
    analyses: tuple[tuple[str, dict[str, Any] | None, Callable[[Mapping[str, Any]], Any], Callable[[Any], str],
                          Callable[[Any, Path], Path], str], ...] = (
        ("scaling", scaling, scaling_analysis.ScalingResult.from_dict, scaling_render.section_md,
         scaling_render.figure, "Scaling study (Table 10)"),
        ("routing", routing, routing_analysis.RoutingResult.from_dict, routing_render.section_md,
         routing_render.figure, "Routing study"),
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
        if isinstance(res, routing_analysis.RoutingResult) and not res.meta.has_split:
            skipped.append("Routing held-out subset split: it needs two subsets, one to tune τ on and one to "
                           "report on; cross-validation is shown instead.")
        if with_figures:
            png = od.figures / f"{name}.png"
            drawn += figures.drawn(od.figures, name, figures.figure_inputs(data),
                            functools.partial(_draw_one, draw, res, png), figure_store)
    od.write_text(REPORT_FILE, report.compose(meta, result, sections=sections, figures=[p.name for p in figs],
                                          skipped=skipped))
    view.write(od, meta, records, [p.name for p in drawn] if with_figures else None)  # view.html: every query browsable (evaluator.render.view)


# ---------------------------------------------------------------- the analyses alone, on a finished run


def _records_with_ptr(od: OutputDir, what: str) -> list[Record]:
    records = od.read_records()
    if not any(r.ptr is not None and r.model is not None for r in records):
        raise DataError(f"{od.path}: no PtR records (a retrieval-only run?); {what} needs both architectures.")
    return records


def scaling_from_output(od: OutputDir, s: Settings, *, data_dir: str | None = None, device: str = "auto",
                        reporter: Reporter = SILENT) -> scaling_analysis.ScalingResult:
    """The scaling study on a finished run: its registry re-read, every vector from its embedding cache."""
    meta = od.read_meta()
    records = od.read_records()
    od.check_agree(meta, records)
    # --data on this command wins; else the run's --tools, else its data folder
    data = data_dir or meta.settings.tools or meta.data_dir or meta.settings.data_dir
    if not data:
        raise DataError(f"{od.path}/meta.json names no data_dir; pass --data DIR.")
    registry = load_registry(data, meta.registry.choice if meta.registry.choice != "?" else "full",
                             fmt=meta.settings.tools_format)
    if meta.registry.size and meta.registry.size != len(registry):
        reporter.warn(f"the registry now has {len(registry):,} APIs, the run had {meta.registry.size:,}")
    run_s = dataclasses.replace(s, embedder=meta.settings.embedder,
                                precision=meta.precision if meta.precision != "?" else "auto", device=device,
                                # old runs had only torch; the cache key is model/backend/precision
                                backend=meta.backend if meta.backend != "?" else "torch")
    embedder = make_embedder(run_s, reporter.progress, reporter)
    encode = lambda texts: embedder.encode(texts, desc="embedding (cache misses)")  # noqa: E731
    api_vecs = encode(registry.texts())
    subs = analysis_subsets(s, sorted({r.subset for r in records}))
    retriever = meta.settings.retriever
    lexical = load_index(registry.texts(), embedder.cache_dir, reporter.warn)[0] if retriever != "dense" else None
    res = scaling_analysis.scaling_study(records, registry, api_vecs, encode, subsets=subs.scaling,
                           divergence_subset=subs.divergence, k=s.k, sizes=s.scaling_sizes, seeds=s.scaling_seeds,
                           about=_about(meta, s, "scaling_subsets"), log=reporter.info,
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


def routing_from_output(od: OutputDir, s: Settings, reporter: Reporter = SILENT) -> routing_analysis.RoutingResult:
    meta = od.read_meta()
    saved = max([meta.k, *meta.ks])
    if s.k > saved:  # the records hold each top list only to the run's largest k
        raise ConfigError(f"--k {s.k} is above the largest k this run saved ({saved}); pass --k {saved} or less.")
    records = _records_with_ptr(od, "routing")
    od.check_agree(meta, records)
    subs = analysis_subsets(s, sorted({r.subset for r in records}))
    opt = _routing_options(s, subs)
    res = routing_analysis.routing_study(records, opt, _about(meta, s, "routing_test"), log=reporter.info)
    od.write_json(ROUTING_FILE, res.to_dict())
    render_outputs(od)
    return res


# ---------------------------------------------------------------- `export trec`


def export_trec(od: OutputDir, to: Path) -> list[Path]:
    """`export trec OUT --to DIR`: the run's ranked lists and gold sets as TREC run and qrels files."""
    records = od.read_records()
    check_writable(to, "--to")
    target = OutputDir(to)
    written = []
    for name, text in trec.export(records).items():
        target.write_text(name, text)
        written.append(to / name)
    return written


# ---------------------------------------------------------------- request files (`requests export|run`)


@dataclass
class Exported:
    out: Path
    per_model: dict[str, int]  # requests written per model
    cache_root: Path


def export_requests(s: Settings, out: Path, reporter: Reporter = SILENT) -> Exported:
    """`requests export`: every chat request the study would send now that is not cached, into `out`.

    The run's checks and order with offline profiles (the same cache keys, no key needed): inputs
    checked, the study prepared, then one collect pass instead of the models' runs. The PtR planners
    need the discovery replies, so a second export after the first results were imported holds them."""
    cache_root = s.resolve_path(s.cache_dir)
    check_writable(out.parent, "requests export: the output file's folder")
    check_writable(cache_root, "--cache-dir")
    if not s.models:
        raise ConfigError("requests export: name the model(s) with --model PROFILE")
    profiles = load_profiles(s, offline=True)
    inputs = checked_inputs(s, reporter)
    study = prepare(s, reporter.progress, inputs, reporter=reporter)
    todo = aio.run(batch_study.collect(study, profiles, cache_root))
    store = JobStore(cache_root)
    try:
        for name, reqs in todo.items():
            store.remember_export(name, [r.custom_id for r in reqs])  # so `requests import` needs no --model
    finally:
        store.close()
    write_lines(out, [r for reqs in todo.values() for r in reqs])
    return Exported(out, {n: len(r) for n, r in todo.items()}, cache_root)


@dataclass
class RanFile:
    results: list[Result]
    stats: CallStats  # the engine's accounting (requests sent, cache hits, ...)
    seconds: float
    ray: RayRun | None = None  # --engine ray: where and how Ray ran it


def plan_request_file(path: Path, model: str, out: Path, cache_root: Path, **overrides: Any) -> str:
    """`requests run --dry-run`: the plan of a request file, as JSON beside `out`; nothing is sent."""
    requests = read_requests(path)
    plan = plan_requests(requests, offline_profile(model, **overrides), cache_root)
    return write_plan(plan, out.with_name(out.stem + ".plan.json"))


def run_request_file(path: Path, model: str, out: Path, cache_root: Path, *, reporter: Reporter = SILENT,
                     ray: RayOptions | None = None, grace_s: float = STOP_GRACE_S, **overrides: Any) -> RanFile:
    """`requests run`: any request file through the online engine (limits, retries, cache, resume) into a
    results file, or with `ray` through Ray Data LLM (`batch.ray_engine`: the same cache, the same
    results). The whole file is checked, and `out` writable, before anything is sent."""
    if out.resolve() == path.resolve():
        raise ConfigError("requests run: --out must not be the input file")
    requests = read_requests(path)
    check_writable(out.parent, "--out")  # one line now, not a traceback after every request was sent
    profile = load_profile(model, **overrides)
    if ray is not None:
        check_ray(profile, ray)  # Ray missing, vLLM missing, a pace Ray cannot keep: one line, before any start
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        profiles = {profile.name: profile}
        _use_servers(profiles, _start_servers(stack, profiles, cache_root))
        ran: RayRun | None = None
        if ray is not None:
            results, stats, ran = run_requests_ray(requests, profiles[profile.name], cache_root, ray, reporter=reporter)
        else:
            results, stats = aio.run(run_requests(requests, profiles[profile.name], cache_root, reporter=reporter,
                                                  grace_s=grace_s))
    write_lines(out, results)
    return RanFile(results, stats, time.perf_counter() - t0, ran)
