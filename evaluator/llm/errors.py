"""Errors of the LLM layer (their text is redacted by `evaluator.core.redact` before it leaves it).

The classes are defined, with their exit codes, in `core.errors`; the engine's modules import them from here.
"""

from __future__ import annotations

from evaluator.core.errors import BudgetExhausted as BudgetExhausted
from evaluator.core.errors import ConfigError as ConfigError
from evaluator.core.errors import FatalLLMError as FatalLLMError

# The error kind of a call whose prompt cannot fit the model's context: refused by the server (llm.retry), or
# known before sending from the profile's `context_tokens` (llm.budget) and then never sent.
CONTEXT_EXCEEDED = "context_exceeded"


def mask(secret: str | None) -> str:
    """How a key appears in reprs: whether it is set, nothing of its value."""
    return "***" if secret else "<unset>"
