"""Fixtures shared across test modules."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """One model export for the whole session: every test (and every CLI it starts, which inherits the
    environment) has a fresh cache folder, and exporting the embedder again for each costs 10-20 s of CPU."""
    os.environ.setdefault("EVALUATOR_SHARED_EXPORTS", tempfile.mkdtemp(prefix="evaluator-exports-"))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails: proves a command needs no endpoint."""

    def refuse(*_a, **_k):
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
