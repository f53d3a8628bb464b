"""bench/gpu_run.py's bookkeeping, which must be right the first time it runs on the GPU machine: the agreement
figures, a result file from stages that failed or never ran, and the copy of a returned result."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import pytest

from bench import gpu_run
from bench.readme import render


@pytest.fixture(autouse=True)
def _no_uname(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's facts without `uname -p` in a child process (`platform.processor`, `platform.platform`)."""
    monkeypatch.setattr(platform, "processor", lambda: "x86_64")
    monkeypatch.setattr(platform, "platform", lambda **_k: "Linux")


def test_agreement_compares_top5_sets_and_names_the_mismatches() -> None:
    cpu = {"G1/1": list("abcdefg"), "G1/2": list("abcdefg"), "G1/3": list("abcdefg"), "G2/9": list("xyz")}
    gpu = {"G1/1": list("bacdexx"), "G1/2": list("abcdfeg"), "G1/3": list("abcdefg"), "G3/4": list("abc")}
    got = gpu_run.agreement(cpu, gpu)
    assert (got["lists"], got["equal_sets"], got["equal_order"], got["share"]) == (3, 2, 1, 0.6667)
    (bad,) = got["mismatches"]
    assert bad["key"] == "G1/2" and bad["only_cpu"] == ["e"] and bad["only_gpu"] == ["f"]
    assert gpu_run.agreement({}, gpu)["share"] is None


def test_stub_lists_are_keyed_by_query_and_stub_text() -> None:
    lists = {"G1/1": {"rtp": ["a"], "stubs": ["s: x", "t: y"], "stub_hits": [["a", "b"], ["c"]]}}
    assert gpu_run.by_stub(lists) == {"G1/1 | s: x": ["a", "b"], "G1/1 | t: y": ["c"]}
    assert gpu_run.by_arch(lists, "rtp") == {"G1/1": ["a"]} and gpu_run.by_arch(lists, "ptr") == {}


def _run(tmp_path: Path, sample: int = 0) -> gpu_run.Run:
    args = argparse.Namespace(out=str(tmp_path / "out"), travel=str(tmp_path / "travel"), sample=sample, device="auto")
    return gpu_run.Run(args)


def test_a_failed_stage_is_recorded_and_the_file_still_renders(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.machine = gpu_run._machine()
    with run.stage("env") as rec:
        assert rec is not None
        rec["gpu"] = {"name": "NVIDIA H200"}
        run.facts.update(gpu="NVIDIA H200", device="cuda")
    with run.stage("embed-fp16") as rec:
        raise RuntimeError("CUDA out of memory")
    with run.stage("study", start_by_s=-1) as rec:  # past its start-by time: skipped, never entered
        assert rec is None
    written = json.loads((tmp_path / "out" / "gpu.json").read_text())
    stages = written["data"]["stages"]
    assert stages["env"]["ok"] and not stages["embed-fp16"]["ok"]
    assert "CUDA out of memory" in stages["embed-fp16"]["error"] and "Traceback" in stages["embed-fp16"]["traceback"]
    assert "not started" in stages["study"]["skipped"]
    assert any("CUDA out of memory" in n for n in written["notes"]) and written["goals"] == []
    text = "\n".join(render(written))  # the README's results block takes it as it takes every benchmark's
    assert "NVIDIA H200" in text and "CUDA out of memory" in text


def test_collect_takes_only_a_full_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(tmp_path, sample=1500)
    run.machine = gpu_run._machine()
    run.write()
    with pytest.raises(SystemExit, match="--sample run"):
        gpu_run.collect(tmp_path / "out" / "gpu.json")
    (tmp_path / "other.json").write_text('{"name": "embedding"}')
    with pytest.raises(SystemExit, match="not a gpu.json"):
        gpu_run.collect(tmp_path / "other.json")
    full = _run(tmp_path / "full")
    full.machine = gpu_run._machine()
    full.write()
    monkeypatch.setattr(gpu_run, "REPO", tmp_path / "repo")
    monkeypatch.setattr("bench.readme.update_readme", lambda: None)
    dest = gpu_run.collect(tmp_path / "full" / "out" / "gpu.json")
    assert dest == tmp_path / "repo" / "bench" / "results" / "gpu.json"
    assert json.loads(dest.read_text())["name"] == "gpu"
