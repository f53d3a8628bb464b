"""The simulator's batch APIs as fixtures (a plugin: tests/conftest.py), for tests/integration/test_batch_api.py,
test_anthropic_batch.py and conformance/: one simulator per module (the batches it keeps are the module's own),
its batch knobs and counters reset before each test.

How long a batch takes to finish is the fixture `batch_turnaround_s` (0.1 s), which a module or conftest may override.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.procs import GroupSim, simulator
from simulator.harness import configure_batch, reset_batch_stats


@pytest.fixture(scope="module")
def batch_sim_server() -> Iterator[GroupSim]:
    with simulator() as handle:
        yield handle


@pytest.fixture
def batch_turnaround_s() -> float:
    return 0.1


@pytest.fixture
def batch_sim(batch_sim_server: GroupSim, batch_turnaround_s: float) -> GroupSim:
    """The module's simulator with its batch knobs at their defaults (`batch_turnaround_s`) and its batch counters
    at zero."""
    configure_batch(batch_sim_server.base_url, reset=True, turnaround_s=batch_turnaround_s)
    reset_batch_stats(batch_sim_server.base_url)
    return batch_sim_server
