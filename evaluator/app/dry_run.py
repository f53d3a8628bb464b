"""Dry run: what a study (or a request file) would send, and what it would cost and take, with nothing sent.

The study's own request building runs in a collect pass (`batch.study.collect`: cached calls are
answered from the cache, every other call is recorded instead of sent), so the plan counts exactly
the requests the real run makes — except the planners behind a reply that is not cached yet (PtR's
discovery, hyde's documents, rewrite's query, and fusion's and route's reuse of them): their prompt
depends on that reply, so each such architecture's planner counts once, an upper bound (no planner
is called when the reply yields nothing to search). Their prompt tokens are those of the same query's
RtP planner prompt (same instructions, query and number of APIs; other APIs). Calls are also counted
per architecture (`by_arch`: each call under the architecture whose code made it; a reused call once).

Per model: calls in total, already cached, to send; prompt tokens by the profile's token rule
(`core.tokens.prompt_tokens`); completion tokens as the mean of this study's cached replies of the
same prompt version, else `max_tokens` (an upper bound; the plan says which); USD online and through
the batch API from the profile's prices; and the time floor the RPM/TPM pacing and concurrency set.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evaluator.batch.collect import collect, offline
from evaluator.batch.files import Request
from evaluator.core import aio
from evaluator.core.money import cost_usd
from evaluator.core.tokens import MESSAGE_TOKENS, prompt_tokens
from evaluator.llm import ChatResult, LLMEngine, ModelProfile, Prepared
from evaluator.llm.limits import PACED_BURST_S, RPM_SAFETY
from evaluator.results.cost import usd
from evaluator.results.schema import OutputDir, repeats_note
from evaluator.study import prompts
from evaluator.study.prepare import Study
from evaluator.study.runner import ARCH_OF_CALL, study_archs

PLAN_FILE = "plan.json"
TOKEN_RULE = (f"prompt tokens = characters of message text / the profile's chars_per_token + {MESSAGE_TOKENS} per "
              "message (+ the response_format JSON when sent); exact against the simulator, an estimate for a "
              "provider's tokenizer")


@dataclass
class ModelPlan:
    model: str
    calls: int  # chat calls the run makes (each PtR planner behind an uncached discovery counted once)
    cached: int  # answered from the cache
    to_send: int  # distinct requests not cached (upper bound: the PtR planners below are in it)
    ptr_planners_upper_bound: int  # of `to_send`: planners that depend on a reply not cached yet (any architecture)
    prompt_tokens: int
    completion_tokens: int | None  # None: no max_tokens and no cached history to estimate from
    completion_basis: dict[str, str]  # per prompt version (or system prompt): where the estimate comes from
    usd_online: float | None  # None: the profile gives no price (or completion unknown)
    usd_batch: float | None  # None: no price or no batch_discount
    time_floor_s: float  # from RPM/TPM pacing alone
    time_floor_by: str  # "rpm", "tpm" or "none" (no limit set)
    latency_rounds: int  # at least this many reply latencies in sequence, from concurrency (+1 PtR dependency)
    concurrency: int
    rpm: float | None
    tpm: float | None
    by_arch: dict[str, int] = field(default_factory=dict)  # calls per architecture (each where it is made)


@dataclass
class DryRunPlan:
    models: list[ModelPlan]
    token_rule: str = TOKEN_RULE
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"sent": 0, "token_rule": self.token_rule, "notes": self.notes,
                "models": {m.model: asdict(m) for m in self.models}}

    def remaining(self) -> str:
        """What is left to send, in a few words (the budget's stop line)."""
        parts = []
        for m in self.models:
            cost = "" if m.usd_online is None else f" (about {usd(m.usd_online, '')} online)"
            ub = f", up to {m.ptr_planners_upper_bound:,} of them planners behind replies" if m.ptr_planners_upper_bound else ""
            parts.append(f"{m.model} {m.to_send:,} requests{ub}{cost}")
        return "Still to send: " + "; ".join(parts) + "."

    def text(self) -> str:
        """The plan as the CLI prints it."""
        out = ["Dry run: nothing was sent."]
        for m in self.models:
            ub = f" (incl. up to {m.ptr_planners_upper_bound:,} planners that depend on replies not cached yet)" \
                if m.ptr_planners_upper_bound else ""
            ct = "unknown" if m.completion_tokens is None else f"{m.completion_tokens:,}"
            out.append(f"{m.model}: {m.calls:,} calls, {m.cached:,} cached, {m.to_send:,} to send{ub}")
            if m.by_arch:
                out.append("  calls by architecture: " + ", ".join(f"{a} {n:,}" for a, n in m.by_arch.items()))
            out.append(f"  tokens to send: {m.prompt_tokens:,} prompt, {ct} completion "
                       f"({'; '.join(f'{k}: {v}' for k, v in m.completion_basis.items()) or 'nothing to send'})")
            out.append(f"  cost: {_usd(m.usd_online)} online, {_usd(m.usd_batch)} through the batch API")
            limit = {"rpm": f"RPM {m.rpm}", "tpm": f"TPM {m.tpm}"}.get(m.time_floor_by, "no RPM/TPM limit")
            out.append(f"  time floor: {_dur(m.time_floor_s)} ({limit}), and at least {m.latency_rounds:,} reply "
                       f"latencies in sequence (concurrency {m.concurrency})")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def _usd(x: float | None) -> str:
    return usd(x, "unknown (no price in the profile)")


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


@dataclass
class _Call:
    key: str
    version: str  # prompt version, or the system prompt's head for a request file
    body: dict[str, Any]  # the provider request body (llm.engine.Prepared.body)
    hit: ChatResult | None
    arch: str = ""  # the architecture whose code made it (a study's collect pass)


def _model_plan(p: ModelProfile, calls: list[_Call], planners: list[tuple[Any, dict[str, Any]]],
                by_arch: dict[str, int] | None = None) -> ModelPlan:
    """`calls`: every call the run makes that is known now; `planners`: ((stand-in key, architecture), stand-in
    body) of the planner behind each architecture's reply that is not cached yet."""
    history: dict[str, list[int]] = defaultdict(list)
    for c in calls:
        if c.hit is not None:
            history[c.version].append(c.hit.completion_tokens)
    unsent: dict[str, _Call] = {}
    for c in calls:
        if c.hit is None:
            unsent.setdefault(c.key, c)
    todo = [(c.version, c.body) for c in unsent.values()]
    distinct_planners = dict(planners)  # identical replies -> identical planners: one request per architecture
    todo += [(prompts.PLANNER_VERSION, b) for b in distinct_planners.values()]
    cpt = p.chars_per_token
    pt = sum(prompt_tokens(b, cpt) for _, b in todo)
    ct: int | None = 0
    basis: dict[str, str] = {}
    for version in dict.fromkeys(v for v, _ in todo):
        bodies = [b for v, b in todo if v == version]
        seen = history.get(version)
        if seen:
            mean = sum(seen) / len(seen)
            basis[version] = f"mean of {len(seen):,} cached replies ({mean:.0f} tokens)"
            est = round(mean * len(bodies))
        else:
            caps = [b.get("max_tokens") or p.max_tokens for b in bodies]
            if any(c is None for c in caps):
                basis[version] = "unknown (no cached reply, no max_tokens)"
                ct = None
                continue
            basis[version] = f"max_tokens ({caps[0]:,}) each: an upper bound, nothing of it cached yet"
            est = sum(int(c) for c in caps if c is not None)
        ct = None if ct is None else ct + est
    n = len(todo)
    usd = cost_usd(p, pt, ct) if ct is not None else None
    usd_b = cost_usd(p, pt, ct, batch=True) if ct is not None else None
    # The engine's pacing: PACED_BURST_S worth may go at once, then RPM (x RPM_SAFETY) and TPM (each call
    # holds its prompt estimate + max_tokens) set the pace.
    floors = {"none": 0.0}
    if p.rpm:
        floors["rpm"] = max(0.0, n - p.rpm / 60 * PACED_BURST_S) * 60 / (p.rpm * RPM_SAFETY)
    if p.tpm:
        held = pt + sum(int(b.get("max_tokens") or p.max_tokens or 0) for _, b in todo)
        floors["tpm"] = max(0.0, held - p.tpm / 60 * PACED_BURST_S) * 60 / p.tpm
    by = max(floors, key=lambda k: floors[k])
    rounds = math.ceil(len(unsent) / p.concurrency) + (1 if planners else 0)
    return ModelPlan(
        model=p.name, calls=len(calls) + len(planners), cached=sum(c.hit is not None for c in calls), to_send=n,
        ptr_planners_upper_bound=len(distinct_planners), prompt_tokens=pt, completion_tokens=ct,
        completion_basis=basis, usd_online=_r(usd), usd_batch=_r(usd_b), time_floor_s=round(floors[by], 1),
        time_floor_by=by, latency_rounds=rounds, concurrency=p.concurrency, rpm=p.rpm, tpm=p.tpm,
        by_arch=dict(by_arch or {}))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


# ---------------------------------------------------------------- a study


class _Planner:
    """Collects every call of the collect pass (by architecture), and stands in the planner behind each reply
    that is not cached yet."""

    def __init__(self, study: Study, profiles: dict[str, ModelProfile]) -> None:
        self.study = study
        self.calls: dict[str, list[_Call]] = {n: [] for n in profiles}
        self.planners: dict[str, list[tuple[Any, dict[str, Any]]]] = {n: [] for n in profiles}
        names = list(study_archs(study))  # in --archs order, by name (a plugin by its `name`)
        self.by_arch: dict[str, dict[str, int]] = {n: dict.fromkeys(names, 0) for n in profiles}
        self._engines = {n: LLMEngine(offline(p), api_key="") for n, p in profiles.items()}  # prepare only, no HTTP

    def _count(self, model: str, arch: str) -> None:
        counts = self.by_arch[model]
        counts[arch] = counts.get(arch, 0) + 1

    def __call__(self, model: str, prepared: Prepared, version: str, hit: ChatResult | None) -> None:
        body = prepared.logical or prepared.body
        arch = ARCH_OF_CALL.get()
        self.calls[model].append(_Call(prepared.key, version, body, hit, arch))
        self._count(model, arch)

    def deferred(self, model: str, run: int, qi: int, arch: str) -> None:
        """The planner `arch` makes once its reply is in, priced with the same query's RtP planner prompt."""
        reg, k = self.study.registry, self.study.retrieval.k
        apis = [reg.apis[i] for i in self.study.rtp[qi].rows[:k]]
        msgs = prompts.planner_messages(self.study.queries[qi].text, [(a.tool_name, a.api_name, a.description)
                                                                     for a in apis])
        p = self._engines[model].prepare(msgs, run=run, prompt_version=prompts.PLANNER_VERSION,
                                         schema=prompts.PLANNER_SCHEMA)
        self.planners[model].append(((p.key, arch), p.logical or p.body))
        self._count(model, arch)


def plan_study(study: Study, profiles: dict[str, ModelProfile], cache_root: Path) -> DryRunPlan:
    """The plan of `study` on these models; reads the cache, sends nothing."""
    planner = _Planner(study, profiles)
    aio.run(collect(study, profiles, cache_root, on_call=planner, on_deferred=planner.deferred))
    plan = DryRunPlan([_model_plan(p, planner.calls[n], planner.planners[n], planner.by_arch[n])
                       for n, p in profiles.items()])
    if any(m.ptr_planners_upper_bound for m in plan.models):
        plan.notes.append("Planners behind replies not cached yet (PtR's discovery, hyde's, rewrite's) are counted "
                          "once per architecture (an upper bound: a reply with nothing to search calls no planner), "
                          "priced with the same query's RtP planner prompt.")
    plan.notes += [repeats_note(n, study.run.runs) for n, p in profiles.items() if p.repeats_runs]
    return plan


def write_plan(plan: DryRunPlan, path: Path) -> str:
    """The plan as JSON at `path` (a study's `OUT/plan.json`); returns the text the CLI prints."""
    OutputDir(path.parent).write_json(path.name, plan.to_dict())
    return plan.text() + f"\nPlan in {path}."


# ---------------------------------------------------------------- a request file


def _system_head(body: dict[str, Any]) -> str:
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str):
            return "system prompt " + repr(m["content"][:40])
    return "requests without a system prompt"


def plan_requests(requests: list[Request], profile: ModelProfile, cache_root: Path) -> DryRunPlan:
    """The plan of a request file on one model (as `requests run` sends it); sends nothing."""
    engine = LLMEngine(offline(profile), cache_root=cache_root, api_key="")
    try:
        calls = []
        for r in requests:
            prepared = engine.prepare_body({"model": profile.model, **r.body})
            calls.append(_Call(prepared.key, _system_head(r.body), prepared.logical, engine.lookup(prepared.key)))
    finally:
        engine.close_cache()
    return DryRunPlan([_model_plan(profile, calls, [])])
