"""Errors of the LLM layer (their text is redacted by `evaluator.core.redact` before it leaves it)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A model profile or its environment is unusable; raised before any work starts."""


class FatalLLMError(RuntimeError):
    """The run cannot continue with this model (bad key, no permission, daily quota).

    The message says what to do. Calls that finished are already in the cache, so a rerun resumes.
    """


def mask(secret: str | None) -> str:
    """How a key appears in reprs: whether it is set, nothing of its value."""
    return "***" if secret else "<unset>"


class BudgetExhausted(FatalLLMError):
    """The next call could pass the run's spending budget; the message says what was spent and how to go on."""
