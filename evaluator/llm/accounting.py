"""Per-model accounting of LLM calls, for the run's report."""

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


@dataclass
class ModelStats:
    """Counters for one model. Tokens count only fresh (billed) calls; cached replies cost nothing."""

    calls: int = 0  # chat() calls
    cache_hits: int = 0  # answered from the cache (or by an identical call already in flight)
    requests: int = 0  # HTTP requests sent, retries included
    retries: int = 0
    http_429: int = 0
    truncated: int = 0  # replies cut at max_tokens (finish_reason "length")
    errors: int = 0  # calls that failed for good (non-fatal ChatResult.error)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)  # fresh calls, seconds, retries included

    def as_dict(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "calls": self.calls,
            "cache_hits": self.cache_hits,
            "requests": self.requests,
            "retries": self.retries,
            "http_429": self.http_429,
            "truncated": self.truncated,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": {
                "p50": percentile(lat, 50),
                "p90": percentile(lat, 90),
                "p99": percentile(lat, 99),
                "n": len(lat),
            },
        }
