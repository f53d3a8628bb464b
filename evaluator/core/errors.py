"""Every error a user may see: one base class, and per kind the exit code and the one line the CLI prints.

`cli.main` catches `EvaluatorError` once and prints `line()` (redacted) to stderr, then exits with
`exit_code`; a new kind of error is a subclass here (or of one of these, beside the code that raises it,
as `llm.cache.StoreError`), never a new branch in the CLI. Exit codes: 0 done; 1 the command stopped (bad key,
exhausted quota: finished calls are cached); 2 a usage, config or data error (before any work); 3 done,
but some LLM calls failed for good (a rerun retries them); 4 stopped at --budget; 5 done, but an architecture
failed on some queries (it raised, broke the plugin contract, timed out or waited in a cycle: those blocks are
left out of the results; fix the architecture); 130 interrupted.

Every class named `*Error` is an exception (tests/unit/test_layout.py); a value that says why something failed is a
`*Failure` (`llm.decide.TransportFailure`, `batch.request_format.BatchFailure`). An exception one module of the
evaluator raises for another to catch, never shown to a user, derives from `InternalSignal`, not from
`EvaluatorError`.
"""

from __future__ import annotations

from typing import ClassVar

EXIT_STOPPED, EXIT_USAGE, EXIT_FAILED_CALLS, EXIT_BUDGET, EXIT_FAILED_BLOCKS, EXIT_INTERRUPTED = 1, 2, 3, 4, 5, 130


class EvaluatorError(Exception):
    """The base of every error the CLI turns into one line and an exit code."""

    exit_code: ClassVar[int] = EXIT_STOPPED

    def line(self) -> str:
        """The one line on stderr (the CLI redacts it)."""
        return f"error: {self}"


class InternalSignal(Exception):
    """The base of exceptions that stay inside the evaluator: raised by one module for the module that called it
    to catch and turn into a value (a retry, a failed call). The CLI does not catch them: one that escapes is a
    bug, shown with its traceback."""


class UserError(EvaluatorError):
    """A mistake of the user's (a flag, a file, a setting), found before any paid work; the message names
    the flag, file or key and says what to do."""

    exit_code = EXIT_USAGE


class ConfigError(UserError, ValueError):
    """A setting, a model profile or its environment is unusable; raised before any work starts."""


class DataError(UserError):
    """Bad or missing input data; the message is one line saying where and what to do."""


class EmbedderError(UserError):
    """The embedding model or its cache cannot be used; the message says what to do instead."""


class OutputError(UserError):
    """An output folder cannot be read or written; the message names it and says what to do."""


class FatalLLMError(EvaluatorError, RuntimeError):
    """The command cannot continue with this model (bad key, no permission, daily quota).

    The message says what to do. Calls that finished are already in the cache, so a rerun resumes.
    """

    exit_code = EXIT_STOPPED

    def line(self) -> str:
        return f"error: {self} Every call finished before the stop is cached: rerun the same command to resume."


class BudgetExhausted(FatalLLMError):
    """The next call could pass the run's spending budget; the message says what was spent and how to go on."""

    exit_code = EXIT_BUDGET

    def line(self) -> str:
        return str(self)
