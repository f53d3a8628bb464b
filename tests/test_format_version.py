"""Output folders carry `format_version`; a folder written by the release before it (0.1.0, no version)
still re-renders with `report`, through the one migration step in `schema.Meta`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evaluator.analysis.metrics import RANK_METRICS
from evaluator.cli import main
from evaluator.schema import (
    FORMAT_VERSION,
    META_FILE,
    QUERIES_FILE,
    REPORT_FILE,
    SUMMARY_FILE,
    Meta,
    OutputDir,
)

# Written by release 0.1.0 (commit 9ca467f), see tests/fixtures/release-0.1.0/README.md.
OLD = Path(__file__).parent / "fixtures" / "release-0.1.0"


@pytest.fixture
def old_copy(tmp_path: Path) -> Path:
    out = tmp_path / "old"
    shutil.copytree(OLD, out)
    (out / "README.md").unlink()
    return out


def test_release_0_1_0_folder_re_renders_with_report(old_copy: Path) -> None:
    written = json.loads((OLD / SUMMARY_FILE).read_text(encoding="utf-8"))
    (old_copy / SUMMARY_FILE).unlink()
    assert "format_version" not in json.loads((old_copy / META_FILE).read_text(encoding="utf-8"))
    assert main(["report", str(old_copy)]) == 0
    again = json.loads((old_copy / SUMMARY_FILE).read_text(encoding="utf-8"))
    # Every row the release wrote comes back unchanged; the only rows added since are the rank metrics.
    added = [r for r in again["rows"] if r not in written["rows"]]
    assert [r for r in again["rows"] if r["metric"] not in RANK_METRICS] == written["rows"]
    assert added and {r["metric"] for r in added} == set(RANK_METRICS)
    assert again["tests"] == written["tests"]
    # The version field stays out of the study view; a profile gains the fields added since, at their defaults,
    # and the settings the settings added since (the retriever: dense, as every run of that release).
    old_profile, new_profile = written["meta"]["models"][0].pop("profile"), again["meta"]["models"][0].pop("profile")
    assert again["meta"]["settings"].pop("retriever") == "dense"
    assert again["meta"] == written["meta"] and new_profile.items() >= old_profile.items()
    report = (old_copy / REPORT_FILE).read_text(encoding="utf-8")
    assert "## Scaling study (Table 10)" in report and "## Complexity-adaptive routing" in report


def test_old_meta_is_read_through_the_migration(old_copy: Path) -> None:
    meta = OutputDir(old_copy).read_meta()
    assert meta.format_version == FORMAT_VERSION
    assert meta.llm_stats["sim"].requests > 0 and meta.cost["sim"].prices.batch_discount == 0.5
    assert meta.models[0].profile is not None and meta.models[0].profile.model == "sim-1"
    assert meta.warnings == {} or all(w.count > 0 for w in meta.warnings.values())


def test_records_round_trip_byte_for_byte(old_copy: Path) -> None:
    od = OutputDir(old_copy)
    before = (old_copy / QUERIES_FILE).read_bytes()
    od.write_records(od.read_records())
    assert (old_copy / QUERIES_FILE).read_bytes() == before


def test_meta_written_now_carries_the_version_and_reads_back(tmp_path: Path, old_copy: Path) -> None:
    od = OutputDir(tmp_path / "new")
    meta = OutputDir(old_copy).read_meta()
    od.write_meta(meta)
    saved = json.loads((od.path / META_FILE).read_text(encoding="utf-8"))
    assert saved["format_version"] == FORMAT_VERSION
    assert od.read_meta() == meta


def test_older_shapes_and_a_newer_version(tmp_path: Path) -> None:
    # format 0 as older writers left it: subsets as a bare list, a model as its bare name, nulls for defaults
    meta = Meta.from_dict({"subsets": ["G2", "G1"], "models": ["sim"], "ks": [5, 1, 5], "k": None, "warnings": None})
    assert meta.subsets == {"G2": 0, "G1": 0} and meta.models[0].name == "sim" and meta.ks == [1, 5] and meta.k == 5
    (tmp_path / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION + 1}), encoding="utf-8")
    (tmp_path / QUERIES_FILE).write_text("", encoding="utf-8")
    with pytest.raises(Exception, match="newer than this evaluator"):
        OutputDir(tmp_path).read_meta()
