"""`report` (and `scaling`, `routing`, `view`) on a folder whose meta.json is another run's (issue 31, item 6):
one line naming what disagrees, and nothing rewritten; a folder that agrees, old or new, re-renders as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.study import study_args, workspace

DERIVED = ("summary.json", "report.md", "view.html", "routing.json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished runs on the tiny data: A (2 runs, 14 APIs), B (1 run, --limit 1, the described registry)."""
    with workspace(tmp_path_factory.mktemp("agree")) as ws:
        root = ws[0]
        a, b = root / "a", root / "b"
        for out, extra in ((a, ("--runs", "2")), (b, ("--runs", "1", "--limit", "1", "--registry", "described"))):
            r = run_cli(*study_args(ws, root / "cache", out, *extra[2:], runs=int(extra[1])), cwd=root)
            assert r.returncode == 0, r.stderr
        yield a, b


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_meta(out: Path, edit) -> None:
    p = out / "meta.json"
    meta = json.loads(p.read_text())
    edit(meta)
    p.write_text(json.dumps(meta))


def _snapshot(out: Path) -> dict[str, bytes]:
    return {n: (out / n).read_bytes() for n in DERIVED if (out / n).exists()}


def test_the_run_records_its_registry_digest(runs):
    a, _ = runs
    meta = json.loads((a / "meta.json").read_text())
    summary = json.loads((a / "summary.json").read_text())
    assert len(meta["registry"]["digest"]) == 16 and summary["meta"]["registry"]["digest"] == meta["registry"]["digest"]


def test_another_runs_meta_json_stops_report_before_anything_is_rewritten(runs, tmp_path):
    a, b = runs
    out = _copy(a, tmp_path / "a")
    shutil.copy(b / "meta.json", out / "meta.json")
    before = _snapshot(out)
    for cmd in ("report", "routing", "view"):
        r = run_cli(cmd, str(out), cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.stderr)
        line = r.stderr.strip()
        assert "\n" not in line and "Traceback" not in line and "meta.json does not belong" in line, line
        assert _snapshot(out) == before


# Each field meta.json states that the records (or the summary.json written with them) contradict.
EDITS = {
    "runs": (lambda m: m.update(runs=3), "runs"),
    "models": (lambda m: m["models"][0].update(name="gemini"), "models"),
    "subset counts": (lambda m: m["subsets"].update(G1_instruction=2), "subsets"),
    "subset names": (lambda m: m.update(subsets={"G9": 3, **{k: v for k, v in m["subsets"].items()
                                                             if k != "G1_instruction"}}), "subsets"),
    "registry size": (lambda m: m["registry"].update(size=7), "registry"),
    "registry digest": (lambda m: m["registry"].update(digest="0" * 16), "registry"),
    "k": (lambda m: m.update(k=3), "k"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_each_disagreement_is_named(runs, tmp_path, case):
    a, _ = runs
    out = _copy(a, tmp_path / "a")
    edit, named = EDITS[case]
    _edit_meta(out, edit)
    before = _snapshot(out)
    r = run_cli("report", str(out), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr and "meta.json does not belong" in r.stderr and r.stderr.count("\n") == 1
    assert _snapshot(out) == before


def test_without_summary_json_the_records_alone_catch_a_smaller_registry(runs, tmp_path):
    a, _ = runs
    out = _copy(a, tmp_path / "a")
    (out / "summary.json").unlink()
    _edit_meta(out, lambda m: m["registry"].update(size=7))
    r = run_cli("report", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "distinct APIs" in r.stderr and not (out / "summary.json").exists()


def test_a_folder_from_before_the_digest_still_re_renders(runs, tmp_path):
    a, _ = runs
    out = _copy(a, tmp_path / "a")
    _edit_meta(out, lambda m: m["registry"].pop("digest"))
    s = json.loads((out / "summary.json").read_text())
    s["meta"]["registry"].pop("digest")
    (out / "summary.json").write_text(json.dumps(s))
    r = run_cli("report", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
