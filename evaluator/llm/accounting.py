"""Per-model accounting of LLM calls, for the run's report and the CLI's exit status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile of an already sorted list (q in [0, 100])."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _spread(values: list[float]) -> dict[str, float | int | None]:
    s = sorted(values)
    return {"p50": percentile(s, 50), "p90": percentile(s, 90), "p99": percentile(s, 99), "n": len(s)}


@dataclass
class ModelStats:
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
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Server time per attempt answered 200: from send to the whole reply, no queueing in it.
    latencies: list[float] = field(default_factory=list, repr=False)
    # Per fresh call: from the call to its first send (concurrency slot, pacing, 429 gate), apart.
    queue_waits: list[float] = field(default_factory=list, repr=False)
    concurrency_limit: float = 0.0  # the limit at the end (the adaptive one moves; a fixed one is the profile's)
    max_in_flight: int = 0

    def fail(self, kind: str) -> None:
        self.errors += 1
        self.failed[kind] = self.failed.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "cache_hits": self.cache_hits,
            "shared_elsewhere": self.shared_elsewhere,
            "requests": self.requests,
            "retries": self.retries,
            "http_429": self.http_429,
            "timeouts": self.timeouts,
            "truncated": self.truncated,
            "reasoning_only": self.reasoning_only,
            "errors": self.errors,
            "failed": dict(sorted(self.failed.items())),
            "dropped_params": list(self.dropped_params),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": _spread(self.latencies),
            "queue_s": _spread(self.queue_waits),
            "concurrency_limit": self.concurrency_limit,
            "max_in_flight": self.max_in_flight,
        }
