"""Benchmark results against the repository's git history (issue 42): a result is written only with its stamp
(the commit, read with git), a result older than the code it measures is stale, and `python -m bench --check
--no-rerun` names what to measure again. Structure and history only: nothing here times anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.procs import PYTHON, run

from bench import check
from bench.common import STAMP_KEYS, Result, Stamp, git, write_result


def test_a_result_is_written_only_with_its_stamp(tmp_path, monkeypatch):
    r = Result(name="probe", title="t", columns=["a"], rows=[[1]])
    with pytest.raises(ValueError, match="stamp"):
        write_result(r)
    stamp = Stamp()
    r.stamp = stamp.end()
    assert set(STAMP_KEYS) <= set(r.stamp) and r.stamp["host"]["cores"]
    assert r.stamp["load"]["max_1m"] >= 0 and len(r.stamp["load"]["start"]) == 3


def _history() -> tuple[str, str, str]:
    """(HEAD, the last commit that changed the code bench/fanout.py measures, that commit's parent)."""
    head = git("rev-parse", "HEAD")
    last = git("log", "-1", "--format=%H", "--", *check.measures("fanout"))
    parent = git("rev-parse", f"{last}^") if last else None
    if not (head and last and parent):
        pytest.skip("needs the repository's git history")
    return head, last, parent


def _result(tmp_path: Path, name: str, stamp: dict | None) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, **({"stamp": stamp} if stamp is not None else {})}))
    return path


def _stamp(commit: str, dirty: list[str] | None = None) -> dict:
    return {"commit": commit, "dirty": bool(dirty), "dirty_paths": dirty or [], "measured": "", "host": {},
            "load": {"start": [0.1], "max_1m": 0.1, "end": [0.1]}}


def test_a_result_older_than_the_code_it_measures_is_stale(tmp_path):
    head, last, parent = _history()
    assert check.verdict(_result(tmp_path, "fanout", _stamp(head))).state == "fresh"
    assert check.verdict(_result(tmp_path, "fanout", _stamp(last))).state == "fresh"  # measured the change itself
    stale = check.verdict(_result(tmp_path, "fanout", _stamp(parent)))  # measured before that change
    assert stale.state == "stale" and last[:9] in stale.why
    # uncommitted changes to the measured code make it stale; to other files, not
    assert check.verdict(_result(tmp_path, "fanout", _stamp(head, ["evaluator/llm/engine.py"]))).state == "stale"
    assert check.verdict(_result(tmp_path, "fanout", _stamp(head, ["README.md"]))).state == "fresh"
    assert check.verdict(_result(tmp_path, "fanout", _stamp("0" * 40))).state == "stale"  # unknown commit
    assert check.verdict(_result(tmp_path, "fanout", None)).state == "unstamped"
    legacy = {"legacy": True, "commit": None, "committed_in": head}
    assert check.verdict(_result(tmp_path, "fanout", legacy)).state == "legacy"
    assert check.verdict(_result(tmp_path, "fanout", {**legacy, "committed_in": parent})).state == "stale"


def test_check_without_reruns_names_what_to_measure_again():
    r = run([PYTHON, "-m", "bench", "--check", "--no-rerun"], timeout=300)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len([ln for ln in lines if ln.split()[:1] and ln.split()[0].endswith(".json")]) == len(check.result_files())
    assert ("describe the code as it is" in r.stdout) and ((r.returncode == 1) == ("to measure them again" in r.stdout))
