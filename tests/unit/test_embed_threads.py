"""Thread pools sized to the CPUs the process may use, waiting passively."""

from __future__ import annotations

import os

from evaluator.core import threads


def test_cgroup_quota_v2_and_unlimited(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads._cgroup_quota(tmp_path, own="") == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads._cgroup_quota(tmp_path, own="") is None
    assert threads._cgroup_quota(tmp_path / "missing", own="") is None


def test_cgroup_quota_is_the_tightest_on_the_process_cgroup_and_its_parents(tmp_path):
    (tmp_path / "pod" / "job").mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "pod" / "cpu.max").write_text("250000 100000\n")  # the container's limit, one level up
    (tmp_path / "pod" / "job" / "cpu.max").write_text("max 100000\n")
    assert threads._cgroup_quota(tmp_path, own="pod/job") == 2.5
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "box").mkdir(parents=True)
    (v1 / "cpu" / "box" / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu" / "box" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads._cgroup_quota(v1, own="box") == 1.0


def test_own_cgroup_reads_v2_then_v1_cpu(tmp_path):
    f = tmp_path / "cgroup"
    f.write_text("0::/user.slice/job.scope\n")
    assert threads._own_cgroup(f) == "user.slice/job.scope"
    f.write_text("4:memory:/x\n2:cpu,cpuacct:/docker/abc\n")
    assert threads._own_cgroup(f) == "docker/abc"


def test_available_cpus_is_the_smallest_of_affinity_and_quota(monkeypatch):
    monkeypatch.delenv("EVALUATOR_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host's count must not leak through
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 2.5)
    assert threads.available_cpus() == 2
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: None)
    assert threads.available_cpus() == 8
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 0.3)
    assert threads.available_cpus() == 1
    monkeypatch.setenv("EVALUATOR_THREADS", "3")
    assert threads.available_cpus() == 3
