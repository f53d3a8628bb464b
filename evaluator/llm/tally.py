"""What the engine counts of each attempt, into the model's `ModelStats`: the concurrency limit's signals
(timeouts, 429s, latency, 5xx bursts), the tokens of every 200 (by core/tokens.py's rule where a body has no
`usage`), and replies cut short by cause; each warning about them is told once per model."""

from __future__ import annotations

import logging
from typing import Any

from evaluator.core.tokens import prompt_tokens, text_tokens
from evaluator.llm.accounting import ModelStats
from evaluator.llm.decide import EMPTY_RETRIES, AttemptOutcome
from evaluator.llm.limiters import ConcurrencyLimit
from evaluator.llm.profiles import ModelProfile
from evaluator.llm.reply import CONTEXT, EMPTY_REPLY, MAX_TOKENS, ChatResult, describe_cut
from evaluator.llm.retry import is_validation_error

log = logging.getLogger("evaluator.llm")


class Tally:
    """Counts for one model (`stats`), and what its concurrency `limit` learns from each attempt."""

    def __init__(self, profile: ModelProfile, stats: ModelStats, limit: ConcurrencyLimit) -> None:
        self._profile = profile
        self._stats = stats
        self._limit = limit
        self._told: set[str] = set()  # cut causes / failure kinds already warned about

    def signal(self, o: AttemptOutcome, epoch: int) -> None:
        """What the concurrency limit learns from an attempt (timeouts, 429s, latency, 5xx bursts)."""
        if o.error is not None:
            if o.error.kind == "timeout":
                self._stats.timeouts += 1
                self._limit.congested(epoch)
            return
        if o.status == 200:
            self._stats.latencies.append(o.latency_s)
        if o.status == 200 or (o.status >= 500 and not is_validation_error(o.body)):
            self._limit.answered(epoch, o.latency_s, server_error=o.status >= 500)
        if o.status == 429:
            self._stats.http_429 += 1
            self._limit.congested(epoch)

    def estimate_usage(self, r: ChatResult | None, logical: dict[str, Any]) -> None:
        """A body without `usage` gets its tokens by core/tokens.py's rule (the prompt from the request
        `logical`, the completion from the reply's text), counted in `usage_estimated` and told once."""
        if r is None or not r.usage_missing:
            return
        cpt = self._profile.prompt.chars_per_token
        r.prompt_tokens = prompt_tokens(logical, cpt)
        r.completion_tokens = text_tokens(r.content or "", cpt)
        self._stats.usage_estimated += 1
        self.tell_once("usage", "%s: the server's replies carry no token usage; their tokens (and cost) are "
                       "estimates by the token rule (characters / chars_per_token), counted in usage_estimated",
                       self._profile.name)

    def tokens(self, r: ChatResult | None) -> None:
        """Tokens of a 200 (billed whether or not the reply is usable); a usable one's kind and cut."""
        if r is None:
            return
        self._stats.prompt_tokens += r.prompt_tokens
        self._stats.completion_tokens += r.completion_tokens
        self._stats.cached_prompt_tokens += r.cached_tokens
        self._stats.cache_write_tokens += r.cache_write_tokens
        if r.error_kind == EMPTY_REPLY:
            self._stats.empty_replies += 1
            self.tell_once(EMPTY_REPLY, "%s: the server answered with an empty reply (no text; billed); such a call is "
                           "sent %d more time(s), then counted as failed (empty_reply); empty replies are counted in "
                           "meta.json (empty_replies)", self._profile.name, EMPTY_RETRIES)
        if r.error is None:
            self._stats.reasoning_only += r.reasoning_only
            self._stats.truncated += r.truncated
            self.cut(r)

    def cut(self, r: ChatResult) -> None:
        """A reply cut short, by cause; each cause but max_tokens is told at once (once per model)."""
        if r.cut is None:
            return
        self._stats.cut[r.cut] = self._stats.cut.get(r.cut, 0) + 1
        if r.cut == MAX_TOKENS:
            return
        fix = {CONTEXT: "restart the server with a larger context (llama.cpp: --ctx-size) and rerun: such replies are "
                        "sent again once the server's context is larger"}.get(
            r.cut, "a later run sends such replies again")
        self.tell_once(f"cut:{r.cut}", "%s: a reply was %s; counted in the report (cut replies) and %s",
                       self._profile.name, describe_cut(r.cut), fix)

    def tell_once(self, what: str, msg: str, *args: Any) -> None:
        if what not in self._told:
            self._told.add(what)
            log.warning(msg, *args)
