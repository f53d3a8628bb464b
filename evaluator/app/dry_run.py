"""Dry run: what a study (or a request file) would send, and what it would cost and take, with nothing sent.

The study's own request building runs in a collect pass (`batch.collect`: cached calls are
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
the batch API from the profile's prices (and where they come from, with their date); and the time floor
the RPM/TPM pacing and concurrency set. Where the provider caches prompt prefixes (`prompt_cache`), every
call after the first with the same system prompt is counted as reading that prompt from the cache (priced at
the cached rate) when the prompt is at least `cache_min_tokens` long, and the first one as writing it when
the cache is explicit (Anthropic): an estimate that assumes the prefix stays cached while the study goes on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evaluator.batch.collect import collect, offline
from evaluator.batch.request_format import Request
from evaluator.core import aio
from evaluator.core.money import cost_usd
from evaluator.core.tokens import MESSAGE_TOKENS, prompt_tokens
from evaluator.llm import ChatResult, LLMEngine, ModelProfile, Prepared
from evaluator.llm.budget import unpriced
from evaluator.llm.limiters import PACED_BURST_S, RPM_SAFETY
from evaluator.llm.profiles import Prompt
from evaluator.results.cost import usd
from evaluator.results.schema import OutputDir, repeats_note
from evaluator.study import prompts
from evaluator.study.prepare import PreparedStudy
from evaluator.study.runner import ARCH_OF_CALL, study_archs

PLAN_FILE = "plan.json"
TOKEN_RULE = (f"prompt tokens = characters of message text / the profile's [prompt] chars_per_token + {MESSAGE_TOKENS} per "
              "message (+ the response_format JSON when sent); exact against the simulator, an estimate for a "
              "provider's tokenizer")


@dataclass
class ModelPlan:
    model: str
    calls: int  # chat calls the study makes (each PtR planner behind an uncached discovery counted once)
    cached: int  # answered from the cache
    to_send: int  # distinct requests not cached (upper bound: the PtR planners below are in it)
    ptr_planners_upper_bound: int  # of `to_send`: planners that depend on a reply not cached yet (any architecture)
    prompt_tokens: int
    completion_tokens: int | None  # None: no max_tokens and no cached history to estimate from
    cached_prompt_tokens: int  # of prompt_tokens: expected from the provider's prompt cache (module doc)
    cache_write_tokens: int  # of prompt_tokens: expected to be written into it (explicit caching)
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
    prices: str | None = None  # where the prices come from and as of when; None: none given
    follows_headers: bool = False  # the pace is a start: the provider's rate-limit headers set it (follow_rate_headers)
    unpriced: str | None = None  # why the USD is unknown, when it is


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
            if m.cached_prompt_tokens or m.cache_write_tokens:
                writes = f", {m.cache_write_tokens:,} written into it" if m.cache_write_tokens else ""
                out.append(f"  prompt cache: ~{m.cached_prompt_tokens:,} of the prompt tokens read from it (at the "
                           f"cached price){writes}")
            if m.unpriced:
                out.append(f"  cost: unknown ({m.unpriced})")
            else:
                out.append(f"  cost: {_usd(m.usd_online)} online, {_usd(m.usd_batch)} through the batch API")
            if m.prices:
                out.append(f"  prices: {m.prices}")
            limit = {"rpm": f"RPM {m.rpm}", "tpm": f"TPM {m.tpm}"}.get(m.time_floor_by, "no RPM/TPM limit")
            follow = "; the limits the provider's rate-limit headers announce replace it" if m.follows_headers else ""
            out.append(f"  time floor: {_dur(m.time_floor_s)} ({limit}{follow}), and at least {m.latency_rounds:,} "
                       f"reply latencies in sequence (concurrency {m.concurrency})")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def _usd(x: float | None) -> str:
    return usd(x, "unknown (no price in the profile)")


class PromptCacheEstimate:
    """Prompt tokens a provider's prompt cache would serve (read) and take in (written), summed as requests go by
    (module doc): a request whose system prompt (at least [prompt] `cache_min_tokens`) was seen before reads it; the first
    of each writes it where caching is explicit. Holds one digest per distinct system prompt."""

    def __init__(self, prompt: Prompt) -> None:
        self.prompt = prompt  # the profile's [prompt]: its prompt cache, the token rule
        self.seen: set[int] = set()
        self.read = self.written = 0

    def add(self, body: dict[str, Any]) -> None:
        p = self.prompt
        if p.cache == "none":
            return
        system = next((m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "system"),
                      None)
        if system is None or not isinstance(system.get("content"), str):
            return
        n = prompt_tokens({"messages": [system]}, p.chars_per_token)
        if n < p.cache_min_tokens:
            return
        if (d := hash(system["content"])) in self.seen:
            self.read += n
        else:
            self.seen.add(d)
            self.written += n if p.cache == "explicit" else 0


def cache_estimate(p: ModelProfile, bodies: list[dict[str, Any]]) -> tuple[int, int]:
    """(prompt tokens read from the provider's prompt cache, written into it) over these requests."""
    est = PromptCacheEstimate(p.prompt)
    for b in bodies:
        est.add(b)
    return est.read, est.written


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


@dataclass
class _Version:
    """The calls of one prompt version (or system prompt) still to send, summed."""

    n: int = 0
    prompt_tokens: int = 0
    caps: int = 0  # their max_tokens summed
    first_cap: int | None = None
    uncapped: bool = False  # one of them has no max_tokens (no profile cap either)


@dataclass
class _Tally:
    """One model's plan as the calls go by, summed: no call and no body is kept, only a 64-bit digest of each
    distinct request still to send (they are counted once however often the study makes them), so a dry run's
    memory grows by ~60 bytes per such request whatever the runs, queries and prompts."""

    profile: ModelProfile
    calls: int = 0
    cached: int = 0
    deferred: int = 0  # planners behind replies not cached yet, each time the study would make one
    unsent: set[int] = field(default_factory=set)
    planners: set[int] = field(default_factory=set)  # distinct (stand-in key, architecture) of those planners
    history: dict[str, list[int]] = field(default_factory=dict)  # version -> [completion tokens, replies] cached
    todo: dict[str, _Version] = field(default_factory=dict)
    prompt_cache: PromptCacheEstimate | None = None

    def __post_init__(self) -> None:
        self.prompt_cache = PromptCacheEstimate(self.profile.prompt)

    def call(self, key: str, version: str, body: dict[str, Any], hit: ChatResult | None) -> None:
        self.calls += 1
        if hit is not None:
            self.cached += 1
            h = self.history.setdefault(version, [0, 0])
            h[0] += hit.completion_tokens
            h[1] += 1
        elif (d := hash(key)) not in self.unsent:
            self.unsent.add(d)
            self._send(version, body)

    def planner(self, key: str, arch: str, body: dict[str, Any]) -> None:
        self.deferred += 1
        if (d := hash((key, arch))) not in self.planners:  # identical replies -> identical planners: one each
            self.planners.add(d)
            self._send(prompts.PLANNER_VERSION, body)

    def _send(self, version: str, body: dict[str, Any]) -> None:
        v = self.todo.setdefault(version, _Version())
        v.n += 1
        v.prompt_tokens += prompt_tokens(body, self.profile.prompt.chars_per_token)
        assert self.prompt_cache is not None
        self.prompt_cache.add(body)
        cap = body.get("max_tokens") or self.profile.sampling.max_tokens
        if cap is None:
            v.uncapped = True
        else:
            v.caps += int(cap)
            v.first_cap = int(cap) if v.first_cap is None else v.first_cap


def _model_plan(t: _Tally, by_arch: dict[str, int] | None = None) -> ModelPlan:
    """The plan of one model from what its calls summed to (`_Tally`)."""
    p = t.profile
    pt = sum(v.prompt_tokens for v in t.todo.values())
    ct: int | None = 0
    basis: dict[str, str] = {}
    for version, v in t.todo.items():
        seen = t.history.get(version)
        if seen and seen[1]:
            mean = seen[0] / seen[1]
            basis[version] = f"mean of {seen[1]:,} cached replies ({mean:.0f} tokens)"
            est = round(mean * v.n)
        elif v.uncapped:
            basis[version] = "unknown (no cached reply, no max_tokens)"
            ct = None
            continue
        else:
            basis[version] = f"max_tokens ({v.first_cap or 0:,}) each: an upper bound, nothing of it cached yet"
            est = v.caps
        ct = None if ct is None else ct + est
    n = sum(v.n for v in t.todo.values())
    assert t.prompt_cache is not None
    cached, written = t.prompt_cache.read, t.prompt_cache.written
    usd = cost_usd(p.prices, pt, ct, cached=cached, cache_write=written) if ct is not None else None
    usd_b = cost_usd(p.prices, pt, ct, batch=True, cached=cached, cache_write=written) if ct is not None else None
    # The engine's pacing: PACED_BURST_S worth may go at once, then RPM (x RPM_SAFETY) and TPM (each call
    # holds its prompt estimate + max_tokens) set the pace.
    floors = {"none": 0.0}
    pace = p.pacing
    if pace.rpm:
        floors["rpm"] = max(0.0, n - pace.rpm / 60 * PACED_BURST_S) * 60 / (pace.rpm * RPM_SAFETY)
    if pace.tpm:
        held = pt + sum(v.caps for v in t.todo.values())
        floors["tpm"] = max(0.0, held - pace.tpm / 60 * PACED_BURST_S) * 60 / pace.tpm
    by = max(floors, key=lambda k: floors[k])
    rounds = math.ceil(len(t.unsent) / pace.concurrency) + (1 if t.deferred else 0)
    return ModelPlan(
        model=p.name, calls=t.calls + t.deferred, cached=t.cached, to_send=n,
        ptr_planners_upper_bound=len(t.planners), prompt_tokens=pt, completion_tokens=ct,
        cached_prompt_tokens=cached, cache_write_tokens=written, completion_basis=basis, usd_online=_r(usd),
        usd_batch=_r(usd_b), time_floor_s=round(floors[by], 1),
        time_floor_by=by, latency_rounds=rounds, concurrency=pace.concurrency, rpm=pace.rpm, tpm=pace.tpm,
        by_arch=dict(by_arch or {}), prices=p.prices.source, unpriced=unpriced(p), follows_headers=pace.follow_rate_headers)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


# ---------------------------------------------------------------- a study


class _Planner:
    """Collects every call of the collect pass (by architecture), and stands in the planner behind each reply
    that is not cached yet."""

    def __init__(self, study: PreparedStudy, profiles: dict[str, ModelProfile]) -> None:
        self.study = study
        self.tally = {n: _Tally(p) for n, p in profiles.items()}
        names = list(study_archs(study))  # in --archs order, by name (a plugin by its `name`)
        self.by_arch: dict[str, dict[str, int]] = {n: dict.fromkeys(names, 0) for n in profiles}
        self._engines = {n: LLMEngine(offline(p), api_key="") for n, p in profiles.items()}  # prepare only, no HTTP

    def _count(self, model: str, arch: str) -> None:
        counts = self.by_arch[model]
        counts[arch] = counts.get(arch, 0) + 1

    def __call__(self, model: str, prepared: Prepared, version: str, hit: ChatResult | None) -> None:
        self.tally[model].call(prepared.key, version, prepared.logical or prepared.body, hit)
        self._count(model, ARCH_OF_CALL.get())

    def deferred(self, model: str, run: int, qi: int, arch: str) -> None:
        """The planner `arch` makes once its reply is in, priced with the same query's RtP planner prompt."""
        reg, k = self.study.registry, self.study.retrieval.k
        apis = [reg.apis[i] for i in self.study.rtp[qi].rows[:k]]
        msgs = prompts.planner_messages(self.study.queries[qi].text, [(a.display, a.description) for a in apis])
        p = self._engines[model].prepare(msgs, run=run, prompt_version=prompts.PLANNER_VERSION,
                                         schema=prompts.PLANNER_SCHEMA)
        self.tally[model].planner(p.key, arch, p.logical or p.body)
        self._count(model, arch)


def plan_study(study: PreparedStudy, profiles: dict[str, ModelProfile], cache_root: Path) -> DryRunPlan:
    """The plan of `study` on these models; reads the cache, sends nothing."""
    planner = _Planner(study, profiles)
    aio.run(collect(study, profiles, cache_root, on_call=planner, on_deferred=planner.deferred, keep=False))
    plan = DryRunPlan([_model_plan(planner.tally[n], planner.by_arch[n]) for n in profiles])
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
    tally = _Tally(profile)
    try:
        for r in requests:
            prepared = engine.prepare_body({"model": profile.model, **r.body})
            tally.call(prepared.key, _system_head(r.body), prepared.logical, engine.lookup(prepared.key))
    finally:
        engine.close_cache()
    return DryRunPlan([_model_plan(tally)])
