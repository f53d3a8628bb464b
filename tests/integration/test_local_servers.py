"""The simulator behind the local-server protocol: started for a profile without an endpoint, stopped with the
study's stack (a process, so here and not in tests/unit/test_app_pipeline.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from evaluator.app import local_servers
from evaluator.app.local_servers import ServerStats, served, start_servers
from evaluator.llm import load_profile
from evaluator.results.schema import SimulatorStats


def test_a_simulated_profile_gets_a_server_behind_the_protocol(tmp_path: Path) -> None:
    declared = {"sim": load_profile("sim", require_key=False),
                "remote": dataclasses.replace(load_profile("sim", base_url="http://127.0.0.1:9/v1", require_key=False),
                                              name="remote")}
    with contextlib.ExitStack() as stack:
        servers = start_servers(stack, declared, tmp_path / "cache")
        assert set(servers) == {"sim"}  # a profile with an endpoint gets none
        server = servers["sim"]
        assert isinstance(server, local_servers.Simulator)
        serving = served(declared, servers)
        assert declared["sim"].connection.base_url == "" and serving["sim"].connection.base_url == server.locate()  # declared unchanged
        assert serving["remote"] is declared["remote"]
        stats = server.stats()
        assert stats == ServerStats(simulator=SimulatorStats.from_dict(server.handle.stats()))
        assert stats.llamacpp is None and stats.simulator is not None and stats.simulator.requests == 0
        proc = server.handle.proc
    assert proc.poll() is not None  # stopped with the stack
