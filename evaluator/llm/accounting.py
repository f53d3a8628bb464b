"""Per-model accounting of LLM calls, for the run's report and the CLI's exit status."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pydantic import TypeAdapter
from pydantic.dataclasses import dataclass


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile of an already sorted list (q in [0, 100])."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class Spread:
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    n: int = 0

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        s = sorted(values)
        return cls(percentile(s, 50), percentile(s, 90), percentile(s, 99), len(s))


@dataclass
class Counters:
    """Counters for one model. Tokens count only fresh (billed) calls; cached replies cost nothing."""

    calls: int = 0  # chat()/send() calls
    cache_hits: int = 0  # answered from the cache, by an identical call in flight, or by another process
    shared_elsewhere: int = 0  # of those: answered by another process that held the call's claim
    requests: int = 0  # HTTP requests sent, retries included
    retries: int = 0
    http_429: int = 0
    timeouts: int = 0  # attempts abandoned after timeout_s (measured from send)
    truncated: int = 0  # replies cut at max_tokens (finish_reason "length"), retried ones included
    reasoning_only: int = 0  # fresh replies whose text came only in reasoning_content / reasoning
    errors: int = 0  # calls that failed for good (non-fatal ChatResult.error); sum of `failed`
    failed: dict[str, int] = field(default_factory=dict)  # those calls by error kind (`http_400`, `timeout`, ...)
    dropped_params: list[str] = field(default_factory=list)  # request fields the host rejected, no longer sent
    cache_damaged: int = 0  # cached replies found damaged (checksum, JSON, fields): not used, requested again
    cut: dict[str, int] = field(default_factory=dict)  # fresh replies cut short, by cause (llm/reply.py cut_cause)
    cut_resent: int = 0  # cached replies cut by the server's context or a filter, sent again (cache.reusable)
    usage_estimated: int = 0  # fresh replies without usage in their body: tokens by the token rule (core/tokens.py)
    empty_replies: int = 0  # fresh 200 replies with no text at all (billed): each call is sent once more at most
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens: served from the provider's prompt cache (the cached price)
    cache_write_tokens: int = 0  # of prompt_tokens: written into it (Anthropic's cache writes)
    concurrency_limit: float = 0.0  # the limit at the end (the adaptive one moves; a fixed one is the profile's)
    max_in_flight: int = 0


@dataclass
class CallStats(Counters):
    """One model's calls as `meta.json` keeps them: the counters, and the timings as percentiles."""

    latency_s: Spread = field(default_factory=Spread)
    queue_s: Spread = field(default_factory=Spread)


@dataclass
class ModelStats(Counters):
    """The engine's live counters; `summary()` is what the command keeps of them."""

    # Server time per attempt answered 200: from send to the whole reply, no queueing in it.
    latencies: list[float] = field(default_factory=list, repr=False)
    # Per fresh call: from the call to its first send (concurrency slot, pacing, 429 gate), apart.
    queue_waits: list[float] = field(default_factory=list, repr=False)

    def fail(self, kind: str) -> None:
        self.errors += 1
        self.failed[kind] = self.failed.get(kind, 0) + 1

    def summary(self) -> CallStats:
        counters = {f: getattr(self, f) for f in Counters.__dataclass_fields__}
        return CallStats(**counters | {"failed": dict(sorted(self.failed.items())), "cut": dict(sorted(self.cut.items())),
                                       "dropped_params": list(self.dropped_params)},
                         latency_s=Spread.of(self.latencies), queue_s=Spread.of(self.queue_waits))

    def as_dict(self) -> dict[str, Any]:
        return _CALL_STATS.dump_python(self.summary(), mode="json")


_CALL_STATS = TypeAdapter(CallStats)
