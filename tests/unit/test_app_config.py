"""Settings and flags a user gets wrong: one line naming the file or flag, the key and what is expected,
before any work (nothing embedded, no LLM call, no output folder)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers.cli import one_line
from helpers.data import make_data_dir

from evaluator.app.run_study import load_profiles
from evaluator.cli.main import main
from evaluator.core.errors import ConfigError
from evaluator.settings.invocation import Invocation, ProfileOverrides
from evaluator.settings.load import load, load_settings
from evaluator.settings.sections import AnalysisSettings, RunSettings
from evaluator.settings.subsets import analysis_subsets


def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "settings.toml"
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize(("text", "expected"), [
    ('[retrieval]\nks = ["a"]\n', "[retrieval] ks = ['a'] holds a string; expected a list of integers"),
    ('[retrieval]\nk = "5"\n', '[retrieval] k = "5" is a string; expected an integer'),
    ("[run]\nruns = true\n", "[run] runs = True is a boolean; expected an integer"),
    ("[data]\nsubsets = \"G1\"\n", '[data] subsets = "G1" is a string; expected a list of strings'),
    ("[run]\nruns = 0\n", "[run] runs = 0 is impossible; it must be between 1 and 1000"),
    ('[embed]\nbackend = "tf"\n', '[embed] backend = "tf" is impossible; it must be one of auto, torch, onnx'),
    ("[run]\nmodel = \"sim\"\n", "unknown key 'model' in [run]; known: models"),
    ("[embeddings]\nmodel = \"x\"\n", "unknown section [embeddings]"),
    ("[analysis]\nscaling_sizes = [100, 0]\n", "scaling_sizes = [100, 0] is impossible; every value must be between 1 and 100000000"),
    ("[retrieval\n", "invalid TOML"),
])
def test_config_file_errors_name_file_key_and_type(tmp_path: Path, text: str, expected: str) -> None:
    path = _cfg(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_settings(path)
    msg = str(e.value)
    assert expected in msg and str(path) in msg and "\n" not in msg


def test_numbers_where_numbers_belong(tmp_path: Path) -> None:
    s = load_settings(_cfg(tmp_path, "[retrieval]\nk = 3\nks = [1, 3]\n[analysis]\nrouting_test = [\"gamma\"]\n"))
    assert (s.retrieval.k, s.retrieval.ks, s.analysis.routing_test) == (3, (1, 3), ("gamma",))


def test_sections_are_frozen_and_flags_go_over_the_file(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "[retrieval]\nk = 3\n[run]\nruns = 2\nbudget_usd = 1.5\nstop_grace_s = 2.0\n")
    s, inv = load(cfg, {"retrieval.ks": [1, 3], "run.runs": 5}, {"dry_run": True})
    assert (s.retrieval.k, s.retrieval.ks, s.run.runs) == (3, (1, 3), 5)
    # [run]'s budget and grace are options of this invocation, not study settings (never in meta.json)
    assert (inv.budget_usd, inv.stop_grace_s, inv.dry_run) == (1.5, 2.0, True)
    assert inv.cli_keys == {"retrieval.ks", "run.runs"}
    assert not hasattr(s.run, "budget_usd") and "budget_usd" not in json.dumps(dataclasses.asdict(s))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.retrieval.k = 7  # type: ignore[misc]  # the point: a checked section cannot change
    with pytest.raises(ConfigError, match="^--ks \\[0\\] is impossible; every value must be between 1 and 100$"):
        load(cfg, {"retrieval.ks": [0]})
    with pytest.raises(ConfigError, match="^--embedder 3 is an integer; expected a string$"):
        load(cfg, {"embed.model": 3})
    with pytest.raises(ConfigError, match="^--stop-grace 700.0 is impossible; it must be between 0 and 600$"):
        load(cfg, {}, {"stop_grace_s": 700.0})
    bad = _cfg(tmp_path, "[run]\nstop_grace_s = -1.0\n")
    with pytest.raises(ConfigError, match=r"settings.toml: \[run\] stop_grace_s = -1.0 is impossible"):
        load(bad)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    err = capsys.readouterr().err
    return rc, err




@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_data_dir(tmp_path / "data")


def test_bad_flags_areone_line(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    rc, err = _run(capsys, "--k", "abc", "--out", str(out))
    assert rc == 2 and "--k" in one_line(err)
    rc, err = _run(capsys, "--retrieval-only", "--timeout", "0", "--data", str(data), "--out", str(out))
    assert rc == 2 and "--timeout" in one_line(err)
    rc, err = _run(capsys, "--config", str(_cfg(tmp_path, '[retrieval]\nks = ["a"]\n')), "--retrieval-only")
    assert rc == 2 and "ks = ['a'] holds a string; expected a list of integers" in one_line(err)
    assert not out.exists()


def test_unusable_folders_fail_before_any_work(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    cache = tmp_path / "cache"
    rc, err = _run(capsys, "--retrieval-only", "--data", str(data), "--out", str(a_file), "--cache-dir", str(cache))
    assert rc == 2 and "--out" in one_line(err) and "is a file" in err
    rc, err = _run(capsys, "--retrieval-only", "--data", str(data), "--out", str(a_file / "sub"), "--cache-dir", str(cache))
    assert rc == 2 and "--out" in one_line(err)
    rc, err = _run(capsys, "--retrieval-only", "--data", str(data), "--cache-dir", str(a_file), "--out", str(tmp_path / "o"))
    assert rc == 2 and "--cache-dir" in one_line(err)
    assert not cache.exists() and not (tmp_path / "o").exists()  # nothing embedded, nothing written


def test_budgets_above_the_registry_and_empty_query_sets(tmp_path: Path, data: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cache, out = tmp_path / "cache", tmp_path / "o"
    base = ["--retrieval-only", "--data", str(data), "--cache-dir", str(cache), "--out", str(out)]
    rc, err = _run(capsys, *base, "--k", "100")
    assert rc == 2 and "--k 100 is above the registry's 14 APIs" in one_line(err)
    rc, err = _run(capsys, *base, "--ks", "1,5,50")
    assert rc == 2 and "--ks 50" in one_line(err)
    rc, err = _run(capsys, *base, "--ks", "1,5,500")  # past the bound of every registry: a record's depth
    assert rc == 2 and "--ks [1, 5, 500] is impossible; every value must be between 1 and 100" in one_line(err)
    (data / "queries" / "G2_instruction.json").write_text("[]")
    (data / "queries" / "G1_instruction.json").write_text("[]")
    rc, err = _run(capsys, *base)
    assert rc == 2 and "quer" in one_line(err)
    assert not (cache / "embeddings").exists() and not out.exists()  # rejected before embedding


def test_analysis_subsets_the_run_lacks_fail_before_any_work(tmp_path: Path, data: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cache, out = tmp_path / "cache", tmp_path / "o"
    cfg = _cfg(tmp_path, '[analysis]\nrouting_test = ["nope"]\n')
    # an endpoint of its own (one nobody listens on): no simulator is started for the sim profile
    rc, err = _run(capsys, "--config", str(cfg), "--model", "sim", "--base-url", "http://127.0.0.1:9/v1", "--runs", "1",
                   "--data", str(data), "--cache-dir", str(cache), "--out", str(out), "--no-progress")
    assert rc == 2 and "routing_test: subset 'nope' is not in this run" in one_line(err)
    assert not (cache / "embeddings").exists() and not out.exists()  # nothing embedded, no LLM call


def test_profile_overrides_from_flags() -> None:
    run = RunSettings(models=("sim",))
    p = load_profiles(run, Invocation(overrides=ProfileOverrides(max_tokens=77, timeout_s=9.5, concurrency=3)))["sim"]
    assert (p.sampling.max_tokens, p.connection.timeout_s, p.pacing.concurrency) == (77, 9.5, 3)


def test_analysis_subsets_rule() -> None:
    s = AnalysisSettings()
    three = analysis_subsets(s, ["G3_instruction", "G1_instruction", "G2_instruction"])
    assert three.routing_train == ["G1_instruction", "G2_instruction"] and three.routing_test == ["G3_instruction"]
    assert three.scaling == ["G1_instruction", "G2_instruction"] and three.divergence == "G1_instruction"
    one = analysis_subsets(s, ["only"])
    assert (one.routing_train, one.routing_test, one.scaling) == ([], [], ["only"])
    s = dataclasses.replace(s, routing_test=("G1",), scaling_subsets=("G2", "G3"))
    set_ = analysis_subsets(s, ["G1_instruction", "G2_instruction", "G3_instruction"])
    assert set_.routing_test == ["G1_instruction"] and set_.routing_train == ["G2_instruction", "G3_instruction"]
    assert set_.scaling == ["G2_instruction", "G3_instruction"]
    s = dataclasses.replace(s, routing_test=("nope",))
    with pytest.raises(ConfigError, match="routing_test: subset 'nope'"):
        analysis_subsets(s, ["G1_instruction"])


def test_summary_meta_holds_no_paths_or_timings(tmp_path: Path) -> None:
    from evaluator.results.schema import Meta

    meta = Meta.from_dict({"settings": {"cache_dir": "/x/cache", "out": "/y", "k": 5}, "data_dir": "/d",
                           "runtime": {"timings": {"embed_s": 1.0}}, "llm_stats": {"sim": {"requests": 3}},
                           "registry": {"choice": "full", "size": 10, "source": "/d/registry"}})
    view = json.dumps(meta.study_view())
    for volatile in ("/x/cache", "/y", "/d", "timings", "requests"):
        assert volatile not in view
