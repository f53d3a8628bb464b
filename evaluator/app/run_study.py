"""The study as a pipeline: checks → load and check the inputs → prepare → run the models (or RtP alone) → write
the records → the analyses beside the main study (scaling, routing) → render.

Each stage is a function handed its inputs and the settings section it reads, returning a typed result
(`Ready`, `Loaded`, `PreparedStudy`, `ModelsRun`, `StudyState`, `Extras`, `Memory`, `Rendered`); `run` calls them in order and
holds nothing else. What meta.json says is built by one function, `build_meta`, from the results so far (`Results`),
and every stage's seconds are gathered there from the results that carry them (`Results.timings`). meta.json is
written twice: once with the records, before queries.jsonl, so a crash in the analyses or the render still leaves
a folder `report` re-renders and a rerun resumes into; and once complete after the render (whose own seconds it
states). Knows nothing of argparse or exit codes (see `cli`). Every check that can fail on a user's input runs
before embedding or any LLM call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from evaluator import __version__
from evaluator.analysis import routing_study, scaling_study
from evaluator.app.dry_run import PLAN_FILE, plan_study, write_plan
from evaluator.app.local_servers import ModelServer, ServerStats, served, start_servers
from evaluator.app.memo import Memo
from evaluator.app.outputs import about, render_outputs, routing_options
from evaluator.batch import collect
from evaluator.batch.request_files import offline_profile
from evaluator.core import aio
from evaluator.core.cache_layout import CacheLayout
from evaluator.core.errors import BudgetExhausted, ConfigError, DataError, OutputError
from evaluator.core.paths import resolve_path
from evaluator.core.progress import SILENT, Progress, Reporter
from evaluator.data import Registry
from evaluator.llamacpp import llama_server
from evaluator.llm import LLMEngine, ModelProfile, load_profile
from evaluator.llm.accounting import CallStats
from evaluator.llm.budget import Budget, check_priced
from evaluator.llm.limiters import SharedRates, rate_folder
from evaluator.llm.profiles import sectioned
from evaluator.render.view_page import VIEW_FILE, parts_folder
from evaluator.results.cost import BatchStats, accounting
from evaluator.results.schema import (
    FAILURE_KINDS,
    META_FILE,
    QUERIES_FILE,
    ROUTING_FILE,
    SCALING_FILE,
    Meta,
    ModelInfo,
    OutputDir,
    PeakMemory,
    Record,
    RegistryInfo,
    Runtime,
    check_writable,
    other_study,
    plain,
)
from evaluator.results.stream import RecordSpill
from evaluator.retrieval.embed import gpu_peak_mib
from evaluator.retrieval.index import searches_folder
from evaluator.retrieval.lexical import BM25Index
from evaluator.retrieval.retrievers import Hybrid, Lexical
from evaluator.settings.invocation import Invocation
from evaluator.settings.sections import (
    AnalysisSettings,
    DataSettings,
    Fitted,
    RetrievalSettings,
    RunSettings,
    Settings,
)
from evaluator.settings.subsets import AnalysisSubsets, analysis_subsets
from evaluator.study import archs
from evaluator.study.prepare import Inputs, PreparedStudy, load_inputs, prepare
from evaluator.study.runner import (
    Sink,
    StudyRunner,
    Unit,
    calls_per_unit,
    probe_archs,
    retrieval_only_records,
)

Log = Callable[[str], None]


@dataclass
class FailedBlocks:
    """The blocks one architecture failed on, of one kind (`results.schema.FAILURE_KINDS`): how many, and the first."""

    arch: str  # as given in --archs (a plugin's spec)
    kind: str
    count: int
    example: str  # the first failed query: model, run, subset and query id
    error: str  # its error

    def line(self) -> str:
        return (f"error: --archs {self.arch}: {self.kind} on {self.count} (query, run) block"
                f"{'s' if self.count != 1 else ''}, e.g. {self.example}: {self.error}")


@dataclass
class RunOutcome:
    out: Path
    failed: Counter[str] = field(default_factory=Counter)  # calls that failed for good, per error kind
    failed_blocks: list[FailedBlocks] = field(default_factory=list)  # per (architecture, kind), in --archs order
    cut: Counter[str] = field(default_factory=Counter)  # replies in the results that were cut short, per cause
    usage_estimated: int = 0  # fresh replies whose body had no usage: tokens (and cost) estimated
    message: str = ""  # set when the invocation did something else than a study (--batch-cancel)


# ---------------------------------------------------------------- the study, stage by stage


def run(s: Settings, inv: Invocation, *, reporter: Reporter = SILENT, retrieval_only: bool = False) -> RunOutcome:
    """The study: each stage in turn, handed what the ones before returned."""
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    ready = check_study(s.run, inv, retrieval_only)
    if inv.batch == "cancel" and ready.profiles:
        return cancel_batches(ready, inv, reporter)
    with contextlib.ExitStack() as stack:
        od = OutputDir(ready.out)
        stack.enter_context(od.writing("a study", reporter.info))  # one writer per --out, before any work
        claim = OutputClaim() if inv.dry_run else claim_output(od, s, inv, retrieval_only, reporter)
        # Simulated and bundled models' servers start now and get ready beside the loading and embedding below.
        servers = {} if inv.dry_run else start_servers(stack, ready.profiles, ready.cache_root)
        loaded = load_checked(s, inv, reporter, analyses=not retrieval_only and inv.extras)
        s = loaded.settings  # the k-ablation fitted to the registry
        if not inv.dry_run:
            claim = same_data(od, claim, loaded.inputs, inv, reporter)
        study = prepare_study(s, loaded.inputs, ready.cache_root, reporter, ready.lineup)
        if ready.lineup is not None and ready.profiles:  # each plugin once on one query, nothing sent: checked
            aio.run(probe_archs(study, ready.lineup))  # before any call
        if inv.dry_run and ready.profiles:  # --dry-run: the plan of the LLM phase; nothing is sent
            return RunOutcome(ready.out, message=write_plan(plan_study(study, ready.profiles, ready.cache_root),
                                                            ready.out / PLAN_FILE))
        extras = plan_extras(s.run, s.analysis, inv.extras, study) if ready.profiles else None
        # Each finished record goes to the spill: past `stream.held()` of them, to disk, so memory does not grow
        # with the study; `write_records` writes queries.jsonl and returns the records (a list, or a stream).
        spill = RecordSpill(od)
        models = record_study(study, ready, servers, inv, reporter, spill)
        results = Results(s, loaded.fitted, created, ready.profiles, study_state(study, s.data), models, extras)
        meta = build_meta(results)
        records = write_records(od, claim, spill, meta)
        # an unchanged rerun reads the analyses of these records back (app.memo)
        kept = Memo(CacheLayout(ready.cache_root).analyses, od.path / QUERIES_FILE)
        if extras is not None:
            extras = run_extras(extras, s.analysis, s.retrieval, study, records, meta, od, reporter, kept)
        # the peak memory before the report, which states it
        results = dataclasses.replace(results, extras=extras, memory=measure_memory(study))
        rendered = render_study(od, ready.cache_root, build_meta(results), records, kept)
        od.write_meta(build_meta(dataclasses.replace(results, rendered=rendered)))
        return outcome(ready, records, models)


# ---------------------------------------------------------------- checks before any work


@dataclass(frozen=True)
class Ready:
    """What the checks before any work settled: where the study writes, its models' profiles as declared (none
    for RtP alone) and its architectures, resolved once (None for RtP alone)."""

    out: Path
    cache_root: Path
    profiles: dict[str, ModelProfile]
    lineup: archs.Lineup | None


def output_path(run: RunSettings) -> Path:
    return Path(run.out) if run.out else Path("results") / time.strftime("%Y%m%d-%H%M%S")


def check_study(run: RunSettings, inv: Invocation, retrieval_only: bool) -> Ready:
    """Every check that needs no data, before any work: writable folders, profiles, architectures, prices for
    a budget, batch APIs for --batch; each failure one line."""
    out = output_path(run)
    cache_root = resolve_path(run.cache_dir)
    check_writable(cache_root, "--cache-dir")
    check_writable(out, "--out")
    profiles = {} if retrieval_only else load_profiles(run, inv, offline=inv.dry_run)
    lineup = None if retrieval_only else resolve_archs(run)
    if inv.budget_usd is not None and profiles and not inv.dry_run:
        check_priced(profiles)  # a budget needs prices and max_tokens: one line, before any work
    if inv.batch and profiles:
        collect.check(profiles)  # a profile without a batch API: one line, before any work
        if inv.batch == "cancel" and inv.dry_run:  # a dry run sends nothing, and cancelling is a request
            raise ConfigError("--dry-run and --batch-cancel do not go together: drop one of them.")
    return Ready(out, cache_root, profiles, lineup)


def cancel_batches(ready: Ready, inv: Invocation, reporter: Reporter) -> RunOutcome:
    """`--batch-cancel`: no study; every open batch of these models cancelled."""
    stats = collect.cancel(ready.profiles, ready.cache_root, reporter.info)
    return RunOutcome(ready.out, message=collect.cancel_message(stats))


def load_profiles(run: RunSettings, inv: Invocation, *, offline: bool = False) -> dict[str, ModelProfile]:
    """Every profile resolved and checked (types, keys present) before any work starts.

    `offline`: for building cache keys only (request export): no key needed, no endpoint contacted."""
    profiles: dict[str, ModelProfile] = {}
    for name in dict.fromkeys(run.models):
        p = offline_profile(name, **inv.overrides.as_kwargs()) if offline else load_profile(name, **inv.overrides.as_kwargs())
        if p.name in profiles:
            raise ConfigError(f"two models are both named {p.name!r}; give each profile its own name")
        if p.server.local_model and not p.connection.base_url and not offline:
            llama_server.check(p, resolve_path(run.cache_dir))  # server and weights installed: one line now
        profiles[p.name] = p
    return profiles


def resolve_archs(run: RunSettings) -> archs.Lineup:
    """Every --archs name a built-in's and every plugin imported and checked (`study.archs.resolve`): one line
    before any work. Route's τ is bound once RtP has run (`archs.Lineup.make`)."""
    return archs.resolve(run.archs, resolve_path)


# ---------------------------------------------------------------- the inputs, loaded and checked


@dataclass(frozen=True)
class Loaded:
    """The data loaded and checked, and the settings the study runs with on it."""

    settings: Settings  # as loaded, but the config's k-ablation budgets above the registry left out
    inputs: Inputs
    fitted: dict[str, Fitted]  # what was fitted to the data, and why (meta.json `fitted`)


def check_inputs(s: Settings, inv: Invocation, inputs: Inputs) -> None:
    """After the data is loaded, before embedding: budgets the registry can serve, and some queries."""
    n = len(inputs.registry)
    data = s.data
    if s.retrieval.k > n:
        raise ConfigError(f"--k {s.retrieval.k} is above the registry's {n:,} APIs; pass --k {n} or less.")
    too_big = sorted(k for k in set(s.retrieval.ks) if k > n)
    if too_big and "retrieval.ks" in inv.cli_keys:
        raise ConfigError(f"--ks {','.join(map(str, too_big))} above the registry's {n:,} APIs; "
                          f"pass --ks with values up to {n}.")
    if not inputs.queries:
        what = f"subsets {','.join(data.subsets)}" if data.subsets else "the query files"
        raise DataError(f"no queries to run: {what} in {inputs.data_dir or ', '.join(data.queries)} gave none"
                        + (f" (--limit {data.limit})" if data.limit else "") + "; check --subsets and the data folder.")


def load_checked(s: Settings, inv: Invocation, reporter: Reporter, *, analyses: bool = False) -> Loaded:
    """The data loaded and every check on it passed (and the config's ablation budgets fitted), before
    anything is embedded. `analyses`: an [analysis] subset the data lacks is one line now, not after
    the LLM phase."""
    inputs = load_inputs(s.data, data_from_cli=inv.data_from_cli)
    check_inputs(s, inv, inputs)
    warn_data(inputs, reporter)
    if analyses:
        analysis_subsets(s.analysis, sorted({q.subset for q in inputs.queries}))
    retrieval, fitted = fit_ks_to_registry(s.retrieval, inv.cli_keys, inputs.registry, reporter.info)
    return Loaded(dataclasses.replace(s, retrieval=retrieval), inputs, fitted)


def warn_data(inputs: Inputs, reporter: Reporter) -> None:
    """Every counted data problem as one line on stderr too, not only in the report's "Data warnings"."""
    for kind, n in sorted(inputs.warnings.counts.items()):
        example = (inputs.warnings.examples.get(kind) or [""])[0]
        reporter.warn(f"data: {n:,} {kind} (e.g. {example[:200]}); all listed under Data warnings in report.md")


def fit_ks_to_registry(retrieval: RetrievalSettings, cli_keys: frozenset[str], registry: Registry,
                       log: Log) -> tuple[RetrievalSettings, dict[str, Fitted]]:
    """Config-file ablation budgets above a small registry are dropped (with a note): a new section, and
    what was fitted; flags are not: `check_inputs` rejects those."""
    n = len(registry)
    ks = retrieval.ks
    if "retrieval.ks" in cli_keys or all(k <= n for k in ks):
        return retrieval, {}
    dropped = sorted(k for k in set(ks) if k > n)
    used = tuple(k for k in ks if k <= n) or (min(retrieval.k, n),)
    why = (f"k-ablation values {','.join(map(str, dropped))} from the config are above the registry's "
           f"{n} APIs; left out")
    log(f"note: {why}")
    return dataclasses.replace(retrieval, ks=used), {"retrieval.ks": Fitted(asked=ks, used=used, why=why)}


def prepare_study(s: Settings, inputs: Inputs, cache_root: Path, reporter: Reporter = SILENT,
                  lineup: archs.Lineup | None = None) -> PreparedStudy:
    """`study.prepare` handed the sections it needs: the checked inputs embedded and RtP retrieved; `lineup`:
    the architectures `check_study` resolved, which every runner of the study makes its own from."""
    return prepare(inputs, embed=s.embed, retrieval=s.retrieval, run=s.run, cache_root=cache_root,
                   progress=reporter.progress, reporter=reporter, lineup=lineup)


# ---------------------------------------------------------------- the output folder claimed


@dataclass
class OutputClaim:
    """What the study found in its --out: the meta.json of the same study (a rerun), and whether the folder's
    results are another study's, replaced under --overwrite (why)."""

    meta: Meta | None = None
    replace: str | None = None


def claim_output(od: OutputDir, s: Settings, inv: Invocation, retrieval_only: bool, reporter: Reporter) -> OutputClaim:
    """One line, before any work, when --out holds another study's results (`schema.other_study`) and
    --overwrite was not given; with it, a note: they are replaced once this study's results are written."""
    meta_file, queries = od.path / META_FILE, od.path / QUERIES_FILE
    why = None
    meta = None
    if meta_file.is_file():
        try:
            meta = od.read_meta()
            why = other_study(meta, s, retrieval_only)
        except OutputError:
            why = "a meta.json this evaluator cannot read"
    elif queries.is_file():
        why = f"a {QUERIES_FILE} without meta.json"
    return _claimed(od, OutputClaim(meta if why is None else None, why), inv, reporter)


def _claimed(od: OutputDir, claim: OutputClaim, inv: Invocation, reporter: Reporter) -> OutputClaim:
    why = claim.replace
    if why is None:
        return claim
    if not inv.overwrite:
        raise OutputError(f"--out {od.path} holds the results of another study ({why}); pass --overwrite to replace "
                          "them, or another --out (a rerun of the same study resumes into its folder)")
    reporter.info(f"note: --overwrite: {od.path} holds the results of another study ({why}); they are replaced "
                  "once this study's are written")
    return claim


def same_data(od: OutputDir, claim: OutputClaim, inputs: Inputs, inv: Invocation, reporter: Reporter) -> OutputClaim:
    """After the data is loaded: the folder's study was run on other data (its registry's digest, its subsets'
    query counts) is another study too."""
    meta = claim.meta
    if meta is None:
        return claim
    digest = inputs.registry.digest()
    counts = dict(sorted(Counter(q.subset for q in inputs.queries).items()))
    why = None
    if meta.registry.digest and meta.registry.digest != digest:
        why = f"its registry's digest is {meta.registry.digest}, this study's {digest}"
    elif meta.subsets and dict(sorted(meta.subsets.items())) != counts:
        why = f"its subsets hold {dict(sorted(meta.subsets.items()))} queries, this study's {counts}"
    return _claimed(od, OutputClaim(None, why), inv, reporter) if why else claim


# ---------------------------------------------------------------- the records: the models run, or RtP alone


@dataclass(frozen=True)
class ModelsRun:
    """The LLM stage's accounting, per model: the engine's calls, what its local server counted (simulated and
    bundled models), the batch APIs' work (--batch), and the chat calls each architecture's code made."""

    llm_stats: dict[str, CallStats]
    servers: dict[str, ServerStats]
    batch: dict[str, BatchStats]
    arch_calls: dict[str, dict[str, int]]
    seconds: float


def record_study(study: PreparedStudy, ready: Ready, servers: dict[str, ModelServer], inv: Invocation,
                 reporter: Reporter, spill: RecordSpill) -> ModelsRun | None:
    """The records into `spill`: every (model, run, query) through every architecture, or RtP's retrieval alone
    when no model is named (None). A stage that stops discards the spill (a rerun makes them again from the
    cache)."""
    if not ready.profiles:
        retrieval_only_records(study, spill)
        return None
    budget = Budget(inv.budget_usd) if inv.budget_usd is not None else None
    try:
        return run_models(study, ready.profiles, ready.cache_root, reporter, budget=budget, servers=servers, inv=inv,
                          sink=spill)
    except BudgetExhausted:  # what remains, priced from the cache now holding every reply received
        spill.discard()
        assert budget is not None
        rest = plan_study(study, ready.profiles, ready.cache_root)
        raise BudgetExhausted(f"{budget.stop_message()} {rest.remaining()}") from None
    except BaseException:
        spill.discard()
        raise


@dataclass(frozen=True)
class StudyState:
    """The prepared study as meta.json states it, taken once its records are made (the analyses that follow
    embed and search too: meta.json counts the study's own work)."""

    data_dir: str
    embedder: str  # its cache name
    precision: str
    backend: str
    registry: RegistryInfo
    subsets: dict[str, int]  # queries per subset
    warnings: dict[str, Any]  # `data.Warnings.as_dict()`: kind -> count and examples
    timings: dict[str, float]  # prepare's seconds: load, embed, RtP search
    embed: dict[str, int | float]  # the embedding cache's work (`embed.EmbedStats`)
    embed_runtime: str
    search: str


def study_state(study: PreparedStudy, data: DataSettings) -> StudyState:
    reg, embedder = study.registry, study.embedder
    return StudyState(str(study.data_dir or ""), embedder.cache_name, embedder.precision, embedder.backend,
                      RegistryInfo(data.registry, len(reg), reg.source, reg.format, reg.digest()), study.subsets,
                      study.warnings.as_dict(), dict(study.timings), dataclasses.asdict(embedder.stats),
                      embedder.description, study.index.description)


def run_models(study: PreparedStudy, profiles: dict[str, ModelProfile], cache_root: Path, reporter: Reporter = SILENT, *,
               budget: Budget | None, servers: dict[str, ModelServer], inv: Invocation, sink: Sink) -> ModelsRun:
    """Every (model, run) of the study, each model on its server when it has one (`servers`, started by the
    caller, who stops them on an error), stopped when the stage ends. With `--batch`, the calls first go through
    the batch APIs; the study then answers them from the cache. `profiles` as declared: the engines get them
    pointed at their servers."""
    serving = served(profiles, servers)
    batch_stats: dict[str, BatchStats] = {}
    if inv.batch == "submit":
        batch_stats = collect.run_batch(study, serving, cache_root, log=reporter.info, budget=budget,
                                        warn=reporter.warn, fallback=inv.batch_fallback)
    per_unit = calls_per_unit(study) * study.run.runs
    bar = reporter.calls({n: per_unit for n in serving})
    t = time.perf_counter()
    # a bundled server restarted after a crash listens on another port: its engine asks where, each request
    locators = {n: server.locate for n, server in servers.items()}
    with bar:
        calls = aio.run(_run_async(study, serving, cache_root, bar, budget, inv, sink, locators))
    seconds = time.perf_counter() - t
    # The simulator's own count of what it answered (a rerun from the cache shows zero requests); the
    # llama.cpp server's file, hash, sizing and token counters.
    server_stats = {n: server.stats() for n, server in servers.items()}
    for server in servers.values():
        server.stop()  # idle from here on: the analyses and the render need none
    return ModelsRun(calls.llm_stats, server_stats, batch_stats, calls.arch_calls, seconds)


@dataclass(frozen=True)
class _Calls:
    llm_stats: dict[str, CallStats]
    arch_calls: dict[str, dict[str, int]]  # model -> architecture -> chat calls its code made


async def _run_async(study: PreparedStudy, profiles: dict[str, ModelProfile], cache_root: Path,
                     bar: Progress, budget: Budget | None, inv: Invocation, sink: Sink,
                     locators: dict[str, Callable[[], str]]) -> _Calls:
    # one RPM per key for every process on this folder (the cache's, or --rate-dir)
    rates = SharedRates(rate_folder(resolve_path(inv.rate_dir) if inv.rate_dir else None, cache_root))
    async with contextlib.AsyncExitStack() as stack:
        engines = {n: await stack.enter_async_context(LLMEngine(p, cache_root=cache_root, budget=budget,
                                                                grace_s=inv.stop_grace_s,
                                                                pacer_factory=rates, token_pacer_factory=rates.tpm,
                                                                locate=locators.get(n))) for n, p in profiles.items()}
        for n, e in engines.items():
            bar.attach(n, e.stats)
        runner = StudyRunner(study, engines, bar, sink=sink, fail_fast=inv.fail_fast)
        units = [Unit(m, r) for m in profiles for r in range(study.run.runs)]
        try:
            await runner.run(units)
        finally:
            stats = {n: e.stats.summary() for n, e in engines.items()}
    calls: dict[str, dict[str, int]] = {}
    for (model, arch), count in runner.arch_calls.items():
        calls.setdefault(model, {})[arch] = count
    return _Calls(stats, calls)


def write_records(od: OutputDir, claim: OutputClaim, spill: RecordSpill, meta: Meta) -> Sequence[Record]:
    """queries.jsonl from the spill, meta.json first (a crash from here on leaves a folder `report` re-renders and
    a rerun resumes into); under --overwrite, the other study's files go first, never mixed with this one's."""
    if claim.replace is not None:
        od.clear(also=(PLAN_FILE, VIEW_FILE, parts_folder(VIEW_FILE)))
    od.write_meta(meta)
    return spill.finish()


# ---------------------------------------------------------------- analyses beside the main study


@dataclass(frozen=True)
class Extras:
    """The scaling and routing studies of this run: the subsets they use (None: neither runs), why any does not
    run (meta.json `analysis_notes`, known before they start), and, once run, the seconds each took."""

    subsets: AnalysisSubsets | None
    notes: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)  # "scaling_s", "routing_s"


def plan_extras(run: RunSettings, a: AnalysisSettings, wanted: bool, study: PreparedStudy) -> Extras:
    """Which analyses follow the main study, on which subsets, and why any does not (`wanted`: not --no-extras)."""
    if not wanted:
        return Extras(None, {"scaling": "not run (--no-extras)", "routing": "not run (--no-extras)"})
    if not {"rtp", "ptr"} <= set(run.archs):
        why = f"needs both RtP and PtR; this run had only {', '.join(run.archs)}"
        return Extras(None, {"scaling": why, "routing": why})
    subs = analysis_subsets(a, sorted(study.subsets))
    return Extras(subs, {} if subs.scaling else {"scaling": "no subset to run it on"})


def run_extras(extras: Extras, a: AnalysisSettings, retrieval: RetrievalSettings, study: PreparedStudy,
               records: Sequence[Record], meta: Meta, od: OutputDir, reporter: Reporter = SILENT,
               kept: Memo | None = None) -> Extras:
    """Scaling and routing as `plan_extras` set them, reusing this run's embeddings and records; `extras` with
    their seconds. `kept`: their results read back when these records and this study were analysed before
    (app.memo)."""
    subs = extras.subsets
    if subs is None:
        return extras
    quiet: Log = reporter.info if reporter.progress else (lambda _m: None)
    kept = kept or Memo(None, od.path / QUERIES_FILE)
    view = meta.study_view()  # every setting, the registry's digest, the embedder: what both analyses read
    t = time.perf_counter()
    if subs.scaling:
        scaling_about = about(meta, a, "scaling_subsets")
        res, was_kept = kept.kept("scaling", {"study": view, "about": plain(scaling_about), "subsets": subs.scaling,
                                              "divergence": subs.divergence}, lambda: scaling_study.scaling_study(
            records, study.registry, study.api_vecs, lambda texts: study.embedder.encode(texts, progress=False),
            subsets=subs.scaling, divergence_subset=subs.divergence, k=retrieval.k, sizes=list(a.scaling_sizes),
            seeds=a.scaling_seeds, about=scaling_about, log=quiet,
            memo=searches_folder(study.embedder.cache_dir), retriever=retrieval.retriever,
            lexical=_lexical(study.retriever)))
        if was_kept:  # the seconds this run spent on it
            res.meta.timing_s = round(time.perf_counter() - t, 2)
        od.write_json(SCALING_FILE, res.to_dict())
    scaling_s = time.perf_counter() - t
    t = time.perf_counter()
    opt = routing_options(retrieval.k, a, subs)
    routing_about = about(meta, a, "routing_test")
    result, was_kept = kept.kept("routing", {"study": view, "about": plain(routing_about), "options": repr(opt)},
                                 lambda: routing_study.routing_study(records, opt, routing_about))
    if was_kept:
        result.meta.timing_s = round(time.perf_counter() - t, 2)
    od.write_json(ROUTING_FILE, result.to_dict())
    return dataclasses.replace(extras, seconds={"scaling_s": scaling_s, "routing_s": time.perf_counter() - t})


def _lexical(retriever: object) -> BM25Index | None:
    """The BM25 index a bm25 / hybrid retriever searches (the scaling study filters its scores)."""
    if isinstance(retriever, Hybrid):
        retriever = retriever.lexical
    return retriever.index if isinstance(retriever, Lexical) else None


# ---------------------------------------------------------------- render


@dataclass(frozen=True)
class Memory:
    """Peak memory up to the report, which states it."""

    rss: PeakMemory
    gpu_mib: float | None  # None on a CPU


def measure_memory(study: PreparedStudy) -> Memory:
    return Memory(peak_rss_mib(), gpu_peak_mib(study.embedder.device))


def peak_rss_mib() -> PeakMemory:
    """Peak resident memory so far (getrusage's ru_maxrss): of this process, of its largest finished
    child (the model export runs in one) and the larger of the two."""
    scale = 2**20 if sys.platform == "darwin" else 2**10  # bytes on macOS, KiB on Linux
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale / 2**20
    return PeakMemory(largest_process=round(max(own, child), 1), this_process=round(own, 1),
                      largest_child=round(child, 1))


@dataclass(frozen=True)
class Rendered:
    seconds: float


def render_study(od: OutputDir, cache_root: Path, meta: Meta, records: Sequence[Record], kept: Memo) -> Rendered:
    """summary.json, report.md, the figures and the viewer from this study's meta and records (`render_outputs`)."""
    t = time.perf_counter()
    render_outputs(od, store_dir=CacheLayout(cache_root).figures, meta=meta, records=records, kept=kept)
    return Rendered(time.perf_counter() - t)


# ---------------------------------------------------------------- meta.json, from the stages' results


@dataclass(frozen=True)
class Results:
    """What the stages returned so far, all meta.json is made of."""

    settings: Settings  # the settings the study ran with (its sections, frozen: meta.json saves them as they are)
    fitted: dict[str, Fitted]
    created: str  # local time the study started
    profiles: dict[str, ModelProfile]  # as declared: an auto-started simulator's port is an accident of this run
    study: StudyState
    models: ModelsRun | None  # None: RtP alone
    extras: Extras | None = None  # None: RtP alone
    memory: Memory | None = None
    rendered: Rendered | None = None

    def timings(self) -> dict[str, float]:
        """Every stage's seconds so far, gathered from the results that carry them (bench/warm_run.py reads them)."""
        models, extras, rendered = self.models, self.extras, self.rendered
        return {**self.study.timings, **({"llm_s": models.seconds} if models else {}),
                **(extras.seconds if extras else {}), **({"render_s": rendered.seconds} if rendered else {})}


# meta.json states each profile as saved (its JSON shape, secrets and per-invocation fields left out), read back
# into its type
_PROFILE = TypeAdapter(ModelProfile)


def build_meta(r: Results) -> Meta:
    """meta.json from the stages' results so far: the one place a `Meta` is made for a study."""
    s, study, models, memory = r.settings, r.study, r.models, r.memory
    servers = models.servers if models else {}
    local = {n: st.llamacpp for n, st in servers.items() if st.llamacpp is not None}
    return Meta(
        version=__version__, settings=s, fitted=dict(r.fitted), data_dir=str(study.data_dir or ""),
        embedder=study.embedder, precision=study.precision, backend=study.backend, registry=study.registry,
        subsets=study.subsets, k=s.retrieval.k, ks=sorted(set(s.retrieval.ks)), runs=s.run.runs if r.profiles else 1,
        models=[ModelInfo(n, p.model, p.server.simulated, _PROFILE.validate_python(sectioned(p.request_settings())))
                for n, p in r.profiles.items()],
        retrieval_only=not r.profiles, warnings=study.warnings,
        llm_stats=models.llm_stats if models else {},
        # Everything that changes from one invocation to the next lives here and stays out of summary.json.
        runtime=Runtime(
            created=r.created, timings=r.timings(), embed=study.embed, embed_runtime=study.embed_runtime,
            search=study.search, peak_gpu_mib=memory.gpu_mib if memory else None,
            simulator_stats={n: st.simulator for n, st in servers.items() if st.simulator is not None}
            if models else None,
            peak_rss_mib=memory.rss if memory else None, local_server=local or None,
            arch_calls=models.arch_calls if models else None),
        analysis_notes=dict(r.extras.notes) if r.extras else {},
        batch=models.batch if models else {},
        cost={n: accounting(p, models.llm_stats.get(n), models.batch.get(n)) for n, p in r.profiles.items()}
        if models else {},
    )


# ---------------------------------------------------------------- what the command tells its user


def outcome(ready: Ready, records: Sequence[Record], models: ModelsRun | None) -> RunOutcome:
    """The calls that failed for good, the blocks that failed (per architecture and kind, in --archs order), the
    replies cut short and those whose tokens were estimated: one pass over the records (maybe a stream)."""
    failed: Counter[str] = Counter()
    cut: Counter[str] = Counter()
    blocks: dict[tuple[str, str], FailedBlocks] = {}
    specs = ready.lineup.specs if ready.lineup is not None else {}
    for r in records:
        failed.update(r.failed_calls)
        cut.update(c for b in r.archs.values() if not (b.side and b.side in r.archs) for c in b.cut_replies())
        for name, f in r.failed_blocks:
            got = blocks.get((name, f.kind))
            if got is None:
                blocks[(name, f.kind)] = FailedBlocks(specs.get(name, name), f.kind, 1, f"model {r.model} run {r.run} "
                                                      f"{r.subset} query {r.query_id}", f.error)
            else:
                got.count += 1
    order = list(specs)
    ranked = [blocks[key] for key in sorted(blocks, key=lambda nk: (
        order.index(nk[0]) if nk[0] in order else len(order), FAILURE_KINDS.index(nk[1])))]
    estimated = sum(st.usage_estimated for st in models.llm_stats.values()) if models else 0
    return RunOutcome(ready.out, failed, ranked, cut=cut, usage_estimated=estimated)
