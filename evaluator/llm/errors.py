"""Errors of the LLM layer and the redaction every message goes through before it leaves it."""

from __future__ import annotations

import re

# Shapes of provider keys we might meet in a server's error text even when it is not *our* key
# (e.g. a proxy echoing another header); masked too, because error text ends up in results.
_KEY_SHAPES = re.compile(r"(AIza[0-9A-Za-z_\-]{20,}|sk-[A-Za-z0-9_\-]{12,}|Bearer\s+\S+)")


class ConfigError(ValueError):
    """A model profile or its environment is unusable; raised before any work starts."""


class FatalLLMError(RuntimeError):
    """The run cannot continue with this model (bad key, no permission, daily quota).

    The message says what to do. Calls that finished are already in the cache, so a rerun resumes.
    """


def redact(text: str, secret: str | None) -> str:
    """Return `text` with `secret` and anything shaped like an API key replaced by `***`."""
    if secret:
        text = text.replace(secret, "***")
    return _KEY_SHAPES.sub("***", text)


def mask(secret: str | None) -> str:
    """How a key appears in reprs: whether it is set, nothing of its value."""
    return "***" if secret else "<unset>"
