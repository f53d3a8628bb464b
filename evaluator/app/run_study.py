"""The application: prepare → run models → write outputs → analyses → render.

Knows the order of the stages and the output folder; knows nothing of argparse or exit codes (see
`cli`). Every check that can fail on a user's input runs before embedding or any LLM call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter

from evaluator import __version__
from evaluator.analysis import routing_study, scaling_study
from evaluator.app.dry_run import PLAN_FILE, plan_study, write_plan
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
from evaluator.llm import LLMEngine, ModelProfile, load_profile, revised
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
    LocalServer,
    Meta,
    ModelInfo,
    OutputDir,
    PeakMemory,
    Record,
    RegistryInfo,
    Runtime,
    SimulatorStats,
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
from evaluator.settings.sections import Fitted, RetrievalSettings, Settings
from evaluator.settings.subsets import analysis_subsets
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
from simulator.harness import SimHandle, start_simulator

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


# ---------------------------------------------------------------- checks before any work


def output_path(s: Settings) -> Path:
    return Path(s.run.out) if s.run.out else Path("results") / time.strftime("%Y%m%d-%H%M%S")


def load_profiles(s: Settings, inv: Invocation, *, offline: bool = False) -> dict[str, ModelProfile]:
    """Every profile resolved and checked (types, keys present) before any work starts.

    `offline`: for building cache keys only (request export): no key needed, no endpoint contacted."""
    profiles: dict[str, ModelProfile] = {}
    for name in dict.fromkeys(s.run.models):
        p = offline_profile(name, **inv.overrides.as_kwargs()) if offline else load_profile(name, **inv.overrides.as_kwargs())
        if p.name in profiles:
            raise ConfigError(f"two models are both named {p.name!r}; give each profile its own name")
        if p.server.local_model and not p.connection.base_url and not offline:
            llama_server.check(p, resolve_path(s.run.cache_dir))  # server and weights installed: one line now
        profiles[p.name] = p
    return profiles


def check_archs(s: Settings) -> None:
    """Every --archs name a built-in's and every plugin imported and checked (`study.archs.resolve`): one line
    before any work."""
    archs.resolve(s.run.archs, 0.0, resolve_path)


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


@dataclass(frozen=True)
class Checked:
    """The data loaded and checked, and the settings the study runs with on it."""

    settings: Settings  # as loaded, but the config's k-ablation budgets above the registry left out
    inputs: Inputs
    fitted: dict[str, Fitted]  # what was fitted to the data, and why (meta.json `fitted`)


def checked_inputs(s: Settings, inv: Invocation, reporter: Reporter, *, analyses: bool = False) -> Checked:
    """The data loaded and every check on it passed (and the config's ablation budgets fitted), before
    anything is embedded. `analyses`: an [analysis] subset the data lacks is one line now, not after
    the LLM phase."""
    inputs = load_inputs(s.data, data_from_cli=inv.data_from_cli)
    check_inputs(s, inv, inputs)
    warn_data(inputs, reporter)
    if analyses:
        analysis_subsets(s.analysis, sorted({q.subset for q in inputs.queries}))
    retrieval, fitted = fit_ks_to_registry(s.retrieval, inv.cli_keys, inputs.registry, reporter.info)
    return Checked(dataclasses.replace(s, retrieval=retrieval), inputs, fitted)


def prepare_study(s: Settings, inputs: Inputs, cache_root: Path, reporter: Reporter = SILENT) -> PreparedStudy:
    """`study.prepare` handed the sections it needs: the checked inputs embedded and RtP retrieved."""
    return prepare(inputs, embed=s.embed, retrieval=s.retrieval, run=s.run, cache_root=cache_root,
                   progress=reporter.progress, reporter=reporter)


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


# ---------------------------------------------------------------- the study


def run(s: Settings, inv: Invocation, *, reporter: Reporter = SILENT, retrieval_only: bool = False) -> RunOutcome:
    out = output_path(s)
    cache_root = resolve_path(s.run.cache_dir)
    check_writable(cache_root, "--cache-dir")
    check_writable(out, "--out")
    profiles = {} if retrieval_only else load_profiles(s, inv, offline=inv.dry_run)
    if not retrieval_only:
        check_archs(s)
    if inv.budget_usd is not None and profiles and not inv.dry_run:
        check_priced(profiles)  # a budget needs prices and max_tokens: one line, before any work
    if inv.batch and profiles:
        collect.check(profiles)  # a profile without a batch API: one line, before any work
        if inv.batch == "cancel":
            if inv.dry_run:  # a dry run sends nothing, and cancelling is a request
                raise ConfigError("--dry-run and --batch-cancel do not go together: drop one of them.")
            stats = collect.cancel(profiles, cache_root, reporter.info)
            return RunOutcome(out, message=collect.cancel_message(stats))
    with contextlib.ExitStack() as stack:
        od = OutputDir(out)
        stack.enter_context(od.writing("a study", reporter.info))  # one writer per --out, before any work
        claim = OutputClaim() if inv.dry_run else claim_output(od, s, inv, retrieval_only, reporter)
        # Simulated and bundled models' servers start now and get ready beside the loading and embedding below.
        sims = start_servers(stack, profiles, cache_root) if profiles and not inv.dry_run else {}
        return _run_study(s, inv, out, cache_root, profiles, sims, reporter, retrieval_only, claim)


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


def _run_study(s: Settings, inv: Invocation, out: Path, cache_root: Path, profiles: dict[str, ModelProfile],
               sims: dict[str, Server], reporter: Reporter, retrieval_only: bool, claim: OutputClaim) -> RunOutcome:
    checked = checked_inputs(s, inv, reporter, analyses=not retrieval_only and inv.extras)
    s = checked.settings  # the k-ablation fitted to the registry
    if not inv.dry_run:
        claim = same_data(OutputDir(out), claim, checked.inputs, inv, reporter)
    study = prepare_study(s, checked.inputs, cache_root, reporter)
    if profiles:  # each plugin once on one query, nothing sent: what it returns is checked before any call
        aio.run(probe_archs(study, archs.resolve(s.run.archs, 0.0, resolve_path)))
    if inv.dry_run and profiles:  # --dry-run: the plan of the LLM phase; nothing is sent
        return RunOutcome(out, message=write_plan(plan_study(study, profiles, cache_root), out / PLAN_FILE))
    od = OutputDir(out)
    # Each finished record goes to the spill: past `stream.held()` of them, to disk, so memory does not grow
    # with the study; `finish` writes queries.jsonl and returns the records (a list, or a stream over the file).
    spill = RecordSpill(od)
    if retrieval_only:
        retrieval_only_records(study, spill)
        meta = build_meta(study, {}, s, checked.fitted)
    else:
        # meta states the profiles as declared: an auto-started simulator's port is an accident of this run
        budget = Budget(inv.budget_usd) if inv.budget_usd is not None else None
        try:
            llm_stats, sim_stats, batch_stats, arch_calls = run_models(
                study, profiles, cache_root, reporter, budget=budget, sims=sims, inv=inv, sink=spill)
        except BudgetExhausted:  # what remains, priced from the cache now holding every reply received
            spill.discard()
            assert budget is not None
            rest = plan_study(study, profiles, cache_root)
            raise BudgetExhausted(f"{budget.stop_message()} {rest.remaining()}") from None
        except BaseException:
            spill.discard()
            raise
        meta = build_meta(study, profiles, s, checked.fitted)
        meta.llm_stats = llm_stats
        meta.runtime.arch_calls = arch_calls
        meta.runtime.simulator_stats = {n: v for n, v in sim_stats.items() if isinstance(v, SimulatorStats)}
        local = {n: v for n, v in sim_stats.items() if isinstance(v, LocalServer)}
        if local:  # the bundled model's file, hash, server version, threads, slots and counters
            meta.runtime.local_server = local
        meta.batch = batch_stats
        meta.cost = {n: accounting(p, meta.llm_stats.get(n), meta.batch.get(n)) for n, p in profiles.items()}
    if claim.replace is not None:  # --overwrite: the other study's files go now, never mixed with this one's
        od.clear(also=(PLAN_FILE, VIEW_FILE, parts_folder(VIEW_FILE)))
    od.write_meta(meta)
    records = spill.finish()
    # an unchanged rerun reads the analyses of these records back (app.memo)
    kept = Memo(CacheLayout(cache_root).analyses, od.path / QUERIES_FILE)
    if not retrieval_only:
        notes = run_extras(s, inv, study, records, meta, od, reporter, kept)
        meta.analysis_notes = notes
        od.write_meta(meta)
    meta.runtime.peak_rss_mib = peak_rss_mib()  # before the report, which states it
    meta.runtime.peak_gpu_mib = gpu_peak_mib(study.embedder.device)
    t = time.perf_counter()
    render_outputs(od, store_dir=CacheLayout(cache_root).figures, meta=meta, records=records, kept=kept)
    study.timings["render_s"] = time.perf_counter() - t
    meta.runtime.timings = study.timings  # every stage's seconds (bench/warm_run.py reads them)
    od.write_meta(meta)
    failed: Counter[str] = Counter()
    cut: Counter[str] = Counter()
    blocks: dict[tuple[str, str], FailedBlocks] = {}
    specs = {name: spec for name, (spec, _) in archs.resolve(s.run.archs, 0.0, resolve_path).items()} \
        if not retrieval_only else {}
    for r in records:  # one pass: the records may be a stream over queries.jsonl
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
    estimated = sum(st.usage_estimated for st in meta.llm_stats.values())
    return RunOutcome(out, failed, ranked, cut=cut, usage_estimated=estimated)


def peak_rss_mib() -> PeakMemory:
    """Peak resident memory so far (getrusage's ru_maxrss): of this process, of its largest finished
    child (the model export runs in one) and the larger of the two."""
    scale = 2**20 if sys.platform == "darwin" else 2**10  # bytes on macOS, KiB on Linux
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale / 2**20
    return PeakMemory(largest_process=round(max(own, child), 1), this_process=round(own, 1),
                      largest_child=round(child, 1))


Server = SimHandle | llama_server.LlamaHandle  # a server this process started for a profile: base_url, stats(), stop()


def start_servers(stack: contextlib.ExitStack, profiles: dict[str, ModelProfile], cache_root: Path) -> dict[str, Server]:
    """A local simulator for each simulated profile without an endpoint, and the bundled llama.cpp server for
    each profile with `local_model` and no endpoint, started without waiting for them (`use_servers`
    waits); they stop with `stack` (an error, Ctrl-C, SIGTERM) or at the end of the LLM stage."""
    out: dict[str, Server] = {}
    for name, p in profiles.items():
        if p.server.simulated and not p.connection.base_url:
            out[name] = stack.enter_context(start_simulator(wait=False))
        elif p.server.local_model and not p.connection.base_url:
            out[name] = stack.enter_context(llama_server.start_llamacpp(p, cache_root))
    return out


def use_servers(profiles: Mapping[str, ModelProfile], sims: Mapping[str, Server]) -> dict[str, ModelProfile]:
    """The profiles, each pointed at the server started for it once it listens (new profiles in a new mapping:
    `profiles` is left as declared)."""
    return {name: p if name not in sims else
            llama_server.use(p, sim) if isinstance(sim := sims[name], llama_server.LlamaHandle) else
            revised(p, base_url=sim.base_url)
            for name, p in profiles.items()}


def run_models(study: PreparedStudy, profiles: dict[str, ModelProfile], cache_root: Path, reporter: Reporter = SILENT, *,
               budget: Budget | None = None, sims: dict[str, Server] | None = None, inv: Invocation,
               sink: Sink,
               ) -> tuple[dict[str, CallStats], dict[str, SimulatorStats | LocalServer],
                          dict[str, BatchStats], dict[str, dict[str, int]]]:
    """Every (model, run) of the study; simulated profiles without an endpoint get a local simulator and
    bundled models (`local_model`) their llama.cpp server (`sims`: ones already started for them), stopped
    when the stage ends. With `--batch`, the calls first go through the batch APIs; the study then answers
    them from the cache."""
    with contextlib.ExitStack() as stack:
        sims = sims if sims is not None else start_servers(stack, profiles, cache_root)
        profiles = use_servers(profiles, sims)
        batch_stats: dict[str, BatchStats] = {}
        if inv.batch == "submit":
            batch_stats = collect.run_batch(study, profiles, cache_root, log=reporter.info, budget=budget,
                                                warn=reporter.warn, fallback=inv.batch_fallback)
        per_unit = calls_per_unit(study) * study.run.runs
        bar = reporter.calls({n: per_unit for n in profiles})
        t = time.perf_counter()
        # a bundled server restarted after a crash listens on another port: its engine asks where, each request
        locators = {n: sim.locate for n, sim in sims.items() if isinstance(sim, llama_server.LlamaHandle)}
        with bar:
            llm_stats, arch_calls = aio.run(_run_async(study, profiles, cache_root, bar, budget, inv, sink, locators))
        study.timings["llm_s"] = time.perf_counter() - t
        # The simulator's own count of what it answered (a rerun from the cache shows zero requests); the
        # llama.cpp server's file, hash, sizing and token counters.
        sim_stats: dict[str, SimulatorStats | LocalServer] = {
            n: LocalServer(**sim.stats()) if isinstance(sim, llama_server.LlamaHandle) else SimulatorStats.from_dict(sim.stats())
            for n, sim in sims.items()}
        for sim in sims.values():
            sim.stop()  # idle from here on: the analyses and the render need none
    return llm_stats, sim_stats, batch_stats, arch_calls


async def _run_async(study: PreparedStudy, profiles: dict[str, ModelProfile], cache_root: Path,
                     bar: Progress, budget: Budget | None, inv: Invocation, sink: Sink,
                     locators: dict[str, Callable[[], str]],
                     ) -> tuple[dict[str, CallStats], dict[str, dict[str, int]]]:
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
    return stats, calls


# meta.json states each profile as saved (its JSON shape, secrets and per-invocation fields left out), read back
# into its type
_PROFILE = TypeAdapter(ModelProfile)


def build_meta(study: PreparedStudy, profiles: dict[str, ModelProfile], s: Settings,
               fitted: dict[str, Fitted] | None = None) -> Meta:
    """`s`: the settings the study ran with (its sections, frozen: meta.json saves them as they are)."""
    return Meta(
        version=__version__, settings=s, fitted=dict(fitted or {}), data_dir=str(study.data_dir or ""),
        embedder=study.embedder.cache_name, precision=study.embedder.precision, backend=study.embedder.backend,
        registry=RegistryInfo(s.data.registry, len(study.registry), study.registry.source, study.registry.format,
                              study.registry.digest()),
        subsets=study.subsets, k=s.retrieval.k, ks=sorted(set(s.retrieval.ks)), runs=s.run.runs if profiles else 1,
        models=[ModelInfo(n, p.model, p.server.simulated, _PROFILE.validate_python(sectioned(p.request_settings())))
                for n, p in profiles.items()],
        retrieval_only=not profiles, warnings=study.warnings.as_dict(),
        # Everything that changes from one invocation to the next lives here and stays out of summary.json.
        runtime=Runtime(created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), timings=study.timings,
                        embed=dataclasses.asdict(study.embedder.stats), embed_runtime=study.embedder.description,
                        search=study.index.description),
    )


# ---------------------------------------------------------------- analyses beside the main study


def run_extras(s: Settings, inv: Invocation, study: PreparedStudy, records: Sequence[Record], meta: Meta, od: OutputDir,
               reporter: Reporter = SILENT, kept: Memo | None = None) -> dict[str, str]:
    """Scaling and routing, reusing this run's embeddings and records; returns why any did not run. `kept`: their
    results read back when these records and this study were analysed before (app.memo)."""
    if not inv.extras:
        return {"scaling": "not run (--no-extras)", "routing": "not run (--no-extras)"}
    if not {"rtp", "ptr"} <= set(s.run.archs):
        why = f"needs both RtP and PtR; this run had only {', '.join(s.run.archs)}"
        return {"scaling": why, "routing": why}
    notes: dict[str, str] = {}
    a = s.analysis
    subs = analysis_subsets(a, sorted(study.subsets))
    quiet: Log = reporter.info if reporter.progress else (lambda _m: None)
    kept = kept or Memo(None, od.path / QUERIES_FILE)
    view = meta.study_view()  # every setting, the registry's digest, the embedder: what both analyses read
    t = time.perf_counter()
    if subs.scaling:
        scaling_about = about(meta, a, "scaling_subsets")
        res, was_kept = kept.kept("scaling", {"study": view, "about": plain(scaling_about), "subsets": subs.scaling,
                                              "divergence": subs.divergence}, lambda: scaling_study.scaling_study(
            records, study.registry, study.api_vecs, lambda texts: study.embedder.encode(texts, progress=False),
            subsets=subs.scaling, divergence_subset=subs.divergence, k=s.retrieval.k, sizes=list(a.scaling_sizes),
            seeds=a.scaling_seeds, about=scaling_about, log=quiet,
            memo=searches_folder(study.embedder.cache_dir), retriever=s.retrieval.retriever,
            lexical=_lexical(study.retriever)))
        if was_kept:  # the seconds this run spent on it
            res.meta.timing_s = round(time.perf_counter() - t, 2)
        od.write_json(SCALING_FILE, res.to_dict())
    else:
        notes["scaling"] = "no subset to run it on"
    study.timings["scaling_s"] = time.perf_counter() - t
    t = time.perf_counter()
    opt = routing_options(s.retrieval.k, a, subs)
    routing_about = about(meta, a, "routing_test")
    result, was_kept = kept.kept("routing", {"study": view, "about": plain(routing_about), "options": repr(opt)},
                                 lambda: routing_study.routing_study(records, opt, routing_about))
    if was_kept:
        result.meta.timing_s = round(time.perf_counter() - t, 2)
    od.write_json(ROUTING_FILE, result.to_dict())
    study.timings["routing_s"] = time.perf_counter() - t
    return notes


def _lexical(retriever: object) -> BM25Index | None:
    """The BM25 index a bm25 / hybrid retriever searches (the scaling study filters its scores)."""
    if isinstance(retriever, Hybrid):
        retriever = retriever.lexical
    return retriever.index if isinstance(retriever, Lexical) else None
