"""The conformance suite's simulator: one per module with its batch APIs (helpers/batch_sim.py), batches taking
0.6 s unless a test says otherwise."""

from __future__ import annotations

import pytest
from helpers.procs import GroupSim


@pytest.fixture
def batch_turnaround_s() -> float:
    return 0.6


@pytest.fixture
def sim(batch_sim: GroupSim) -> GroupSim:
    return batch_sim
