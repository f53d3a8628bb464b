"""The suite's set-up: fixtures shared across directories come from `helpers` as plugins; one embedder export for
the whole session; the longest files first, so that xdist's workers finish together.

tests/unit/: no process, no socket, no sleep (tests/unit/conftest.py fails a test that tries); fast:
`pytest tests/unit`. tests/integration/: everything that starts a process or a server or opens a socket. Every
process a test starts is in its own process group and stopped by it (helpers/procs.py), and a process the suite
started that outlives it fails the run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterator

import pytest

from evaluator.core.cache_layout import SHARED_FIGURES_ENV
from evaluator.retrieval.backends import SHARED_EXPORTS_ENV

pytest_plugins = ("helpers.procs", "helpers.cli", "helpers.llm", "helpers.batch_sim", "helpers.browser", "helpers.clock")

# Folders every cache folder of the session shares: the embedder's exports and the drawn figures (both keyed by
# what they were made from, so sharing only saves making them again).
SHARED = (SHARED_EXPORTS_ENV, SHARED_FIGURES_ENV)
DURATIONS = "evaluator/file-durations"  # pytest's cache: the seconds each test file took in the runs before
LONGEST = ("real_model", "ray")  # markers of the files that take longest: first while no run was timed yet

_made_shared = pytest.StashKey[list[str]]()
_took = pytest.StashKey[dict[str, float]]()


def pytest_configure(config: pytest.Config) -> None:
    """One model export and one figure store for the whole session: every test (and every CLI it starts, which
    inherits the environment) has a fresh cache folder; exporting the embedder again for each costs 10-20 s of CPU,
    drawing the same figures again ~2 s a study. xdist's workers inherit the main process's folders; the main
    process removes them at the end."""
    # Started from a script's `cmd &` (no job control), the suite ignores SIGINT, and so would every process it
    # starts (an ignored signal stays ignored through exec): the tests that press Ctrl-C on a CLI would see it do
    # nothing. The suite's children start as from a terminal (a handler is reset to the default through exec).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # xdist's loadfile reorders the files by their number of tests unless told not to: the order below is kept
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    made = config.stash[_made_shared] = []
    for env in SHARED:
        if env not in os.environ:
            os.environ[env] = tempfile.mkdtemp(prefix=f"{env.lower()}-")
            made.append(os.environ[env])
    config.stash[_took] = {}


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        for made in config.stash.get(_made_shared, []):
            shutil.rmtree(made, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each file's tests stay together and in their order; the files go longest first: by the seconds each took in
    the runs before (pytest's cache), else those marked `real_model` or `ray`, then the integration tests, then the
    unit tests. xdist's workers (`-n 2 --dist loadfile`) then take the long files first and finish together."""
    cache = getattr(config, "cache", None)  # absent under `-p no:cacheprovider`
    took: dict[str, float] = cache.get(DURATIONS, {}) if cache is not None else {}

    def rank(item: pytest.Item) -> tuple[int, float]:
        path = item.nodeid.split("::")[0]
        if path in took:
            return 0, -took[path]
        if any(item.get_closest_marker(m) for m in LONGEST):
            return 0, -1e9
        return 1, 0.0 if "/integration/" in path else 1.0

    first: dict[str, tuple[tuple[int, float], int]] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], (rank(item), i))
    items.sort(key=lambda item: first[item.nodeid.split("::")[0]])  # stable: a file's own order is kept


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each file's seconds, summed in the main process (xdist's workers report there too)."""
    took = _session_took[0] if _session_took else None
    if took is not None:
        path = report.nodeid.split("::")[0]
        took[path] = took.get(path, 0.0) + report.duration


_session_took: list[dict[str, float]] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        _session_took[:] = [session.config.stash[_took]]


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    took = config.stash.get(_took, {})
    cache = getattr(config, "cache", None)
    if cache is not None and not hasattr(config, "workerinput") and took:
        cache.set(DURATIONS, {**cache.get(DURATIONS, {}), **{k: round(v, 2) for k, v in took.items()}})


@pytest.fixture(autouse=True)
def _process_hooks_restored() -> Iterator[None]:
    """What `cli.main` sets for its process (the stop signals' handlers, the excepthook, the warning printer) is put
    back after a test that called it in this process, so that no later test runs under it."""
    signals = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    saved = {s: signal.getsignal(s) for s in signals}
    hooks = sys.excepthook, warnings.showwarning
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
    sys.excepthook, warnings.showwarning = hooks


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails: proves a command needs no endpoint."""

    def refuse(*_a, **_k):
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
