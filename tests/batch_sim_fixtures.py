"""The simulator's batch APIs as pytest fixtures, shared by tests/test_batch_api.py and tests/conformance/:
one simulator per module, its batch knobs and counters reset before each test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simulator.harness import configure_batch, reset_batch_stats, start_simulator  # noqa: E402


def batch_sim_fixtures(turnaround_s: float):
    """(sim_server, sim) fixtures: `sim` is the module's simulator with fresh knobs (`turnaround_s`)."""

    @pytest.fixture(scope="module")
    def sim_server():
        with start_simulator() as handle:
            yield handle

    @pytest.fixture
    def sim(sim_server):
        configure_batch(sim_server.base_url, reset=True, turnaround_s=turnaround_s)
        reset_batch_stats(sim_server.base_url)
        return sim_server

    return sim_server, sim
