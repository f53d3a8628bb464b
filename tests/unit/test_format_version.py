"""Every saved file carries `format_version`; folders written before it (release 0.1.0: commits 9ca467f and
2acddc3, no version anywhere) still re-render with `report`, through the one module `evaluator.results.migrate`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES

from evaluator.analysis.metric_defs import RANK_METRICS
from evaluator.analysis.routing_study import RoutingResult
from evaluator.analysis.scaling_study import ScalingResult
from evaluator.cli.main import main
from evaluator.results import migrate
from evaluator.results.schema import (
    FORMAT_VERSION,
    META_FILE,
    QUERIES_FILE,
    REPORT_FILE,
    ROUTING_FILE,
    SCALING_FILE,
    SUMMARY_FILE,
    Meta,
    OutputDir,
)

# Written by release 0.1.0 (commit 9ca467f), see tests/fixtures/release-0.1.0/README.md.
OLD = FIXTURES / "release-0.1.0"
# Written by commit 2acddc3 (ToolBench queries, a small registry), see tests/fixtures/commit-2acddc3/README.md.
OLDER = FIXTURES / "commit-2acddc3"


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
    assert again["meta"]["settings"]["retrieval"].pop("retriever") == "dense"
    # the release's flat settings come back nested by section (format 3), every value kept
    assert again["meta"].pop("settings") == migrate.nested_settings(written["meta"].pop("settings"))
    assert again["meta"] == written["meta"] and new_profile.items() >= old_profile.items()
    report = (old_copy / REPORT_FILE).read_text(encoding="utf-8")
    assert "## Scaling study (Table 10)" in report and "## Complexity-adaptive routing" in report


def test_old_meta_is_read_through_the_migration(old_copy: Path) -> None:
    meta = OutputDir(old_copy).read_meta()
    assert meta.format_version == FORMAT_VERSION
    assert meta.llm_stats["sim"].requests > 0 and meta.cost["sim"].prices.batch_discount == 0.5
    assert meta.models[0].profile is not None and meta.models[0].profile.model == "sim-1"
    assert meta.warnings == {} or all(w.count > 0 for w in meta.warnings.values())


def test_records_round_trip_into_the_archs_mapping(old_copy: Path) -> None:
    od = OutputDir(old_copy)
    lines = (old_copy / QUERIES_FILE).read_text(encoding="utf-8").splitlines()
    od.write_records(od.read_records())
    again = (old_copy / QUERIES_FILE).read_text(encoding="utf-8").splitlines()
    # Format 4: the same content, RtP's and PtR's blocks moved unchanged under `archs`, rtp first.
    for old, new in zip(lines, again, strict=True):
        o, n = json.loads(old), json.loads(new)
        assert "rtp" not in n and "ptr" not in n and list(n["archs"]) == [a for a in ("rtp", "ptr") if o.get(a)]
        assert n["archs"] == {a: o[a] for a in ("rtp", "ptr") if o.get(a)}
        assert {k: v for k, v in n.items() if k != "archs"} == {k: v for k, v in o.items() if k not in ("rtp", "ptr")}
    # and from there byte for byte
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


def test_flat_settings_of_format_2_are_read_by_section() -> None:
    flat = {"data_dir": "d", "limit": 3, "embedder": "m", "batch_size": 8, "k": 3, "ks": [1, 3], "retriever": "bm25",
            "models": ["sim"], "out": "o", "scaling_sizes": [10], "routing_test": ["G3"],
            "embed_threads": 4}  # a name no version saves any more: left out
    meta = Meta.from_dict({"format_version": 2, "settings": flat})
    s = meta.settings
    assert (s.data.dir, s.data.limit, s.embed.model, s.embed.batch_size) == ("d", 3, "m", 8)
    assert (s.retrieval.k, s.retrieval.ks, s.retrieval.retriever) == (3, (1, 3), "bm25")
    assert (s.run.models, s.run.out, s.analysis.scaling_sizes, s.analysis.routing_test) == (("sim",), "o", (10,), ("G3",))
    assert meta.to_dict()["settings"]["retrieval"] == {"k": 3, "ks": [1, 3], "retriever": "bm25", "fallback_to_query": False}
    # summary.json's study view is nested the same way, so an older folder's view compares with a new one's
    view = migrate.summary({"format_version": 2, "meta": {"settings": flat}, "rows": []})
    assert view["meta"]["settings"]["embed"] == {"model": "m", "batch_size": 8}
    assert migrate.meta({"settings": migrate.nested_settings(flat), "format_version": 3})["settings"]["data"]["dir"] == "d"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / "README.md").unlink()
    return dst


def _rows(summary: dict) -> dict[tuple, dict]:
    return {(r["model"], r["subset"], r["arch"], r["metric"], r["k"], r["gold"]): r for r in summary["rows"]}


def test_commit_2acddc3_folder_re_renders_with_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _copy(OLDER, tmp_path / "older")
    written = json.loads((OLDER / SUMMARY_FILE).read_text(encoding="utf-8"))
    (out / SUMMARY_FILE).unlink()
    assert main(["report", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    again = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))
    old_rows, new_rows = _rows(written), _rows(again)
    # Every RtP/PtR row that commit wrote comes back with the same values; the rows of metrics added
    # since (truncated replies, the rank metrics) are the only new ones.
    assert {"rtp", "ptr"} <= {a for (_, _, a, *_) in old_rows}
    assert {k: new_rows[k] for k in old_rows} == old_rows
    assert {k[3] for k in new_rows.keys() - old_rows.keys()} <= {"planner_truncated", "discovery_truncated",
                                                                  *RANK_METRICS}
    assert again["tests"] == written["tests"]
    assert again["format_version"] == FORMAT_VERSION and "format_version" not in written
    report = (out / REPORT_FILE).read_text(encoding="utf-8")
    assert "## Scaling study (Table 10)" in report and "## Complexity-adaptive routing" in report
    # what the sections state about that run comes from its files
    assert "2,594 APIs" in report and "(simulated LLM)" in report
    # written before the embedding runtimes: torch, as the migration says (not "?")
    assert "(torch fp32)" in report and OutputDir(out).read_meta().backend == "torch"


def test_every_older_analysis_file_is_read_through_migrate(tmp_path: Path) -> None:
    for folder in (OLD, OLDER):
        od = OutputDir(_copy(folder, tmp_path / folder.name))
        for name, typed in ((SCALING_FILE, ScalingResult), (ROUTING_FILE, RoutingResult)):
            saved = json.loads((folder / name).read_text(encoding="utf-8"))
            assert "format_version" not in saved
            data = od.read_json(name)
            assert data is not None and data["format_version"] == FORMAT_VERSION
            result = typed.from_dict(data)
            assert result.meta.models == ["sim"]
        assert od.read_json(SUMMARY_FILE)["rows"] == json.loads((folder / SUMMARY_FILE).read_text())["rows"]
    # 2acddc3 kept seconds per stage in scaling.json: the total is what the section states now
    older = ScalingResult.from_dict(json.loads((OLDER / SCALING_FILE).read_text(encoding="utf-8")))
    assert older.meta.timing_s == 3.21


def test_analysis_files_written_now_carry_the_version(tmp_path: Path) -> None:
    out = _copy(OLDER, tmp_path / "older")
    assert main(["report", str(out)]) == 0
    od = OutputDir(out)
    for name, typed in ((SCALING_FILE, ScalingResult), (ROUTING_FILE, RoutingResult)):
        result = typed.from_dict(od.read_json(name))
        od.write_json(name, result.to_dict())
        saved = json.loads((out / name).read_text(encoding="utf-8"))
        assert saved["format_version"] == FORMAT_VERSION
        assert typed.from_dict(saved).to_dict() == saved  # a written file reads back to itself


@pytest.mark.parametrize("name", [META_FILE, SCALING_FILE, ROUTING_FILE])
def test_a_newer_file_is_one_line_naming_it(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _copy(OLDER, tmp_path / "older")
    d = json.loads((out / name).read_text(encoding="utf-8"))
    (out / name).write_text(json.dumps({**d, "format_version": FORMAT_VERSION + 1}), encoding="utf-8")
    assert main(["report", str(out)]) != 0
    err = capsys.readouterr().err
    assert name in err and "newer than this evaluator" in err and "Traceback" not in err


def test_records_of_an_older_folder_go_through_the_record_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def step(d: dict, version: int) -> dict:
        seen.append(version)
        return d

    monkeypatch.setattr(migrate, "record", step)
    older = OutputDir(_copy(OLDER, tmp_path / "older")).read_records()
    assert older and seen == [0] * len(older)
    seen.clear()
    new = OutputDir(tmp_path / "new")
    new.write_meta(Meta())
    new.write_records(older)
    assert new.read_records() == older and seen == []  # a current folder's lines are parsed as they are
