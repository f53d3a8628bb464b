"""`requests run --engine ray` given wrong: one line before Ray starts (issue 30), also when Ray is not installed."""

from __future__ import annotations

import sys

import pytest
from helpers.request_files import write_requests

from evaluator.cli import main as cli

# Imported here, as before the split: the warnings Ray's import raises (pydantic's deprecations) fire now, not in
# the command under test. A user's fresh process gets them as lines before the one-line error (reported, issue 37).
pytest.importorskip("ray.data.llm", reason="Ray is an optional extra: pip install 'evaluator[ray]'")


def _main(args: list[str], capfd) -> tuple[int, str, str]:
    rc = cli.main(args)
    out, err = capfd.readouterr()
    return rc, out, err


def test_ray_mistakes_are_one_line_before_ray_starts(tmp_path, capfd, monkeypatch):
    write_requests(tmp_path / "in.jsonl", 3)
    run = ["requests", "run", str(tmp_path / "in.jsonl"), "--model", "sim", "--out", str(tmp_path / "o.jsonl"),
           "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    cases = [([*run, "--address", "auto"], "--address is an option of --engine ray"),
             ([*run, "--engine", "ray", "--processor", "vllm"], "needs vLLM"),
             ([*run, "--engine", "ray", "--rpm", "30"], "whole requests per second per actor"),
             ([*run, "--engine", "ray", "--actors", "0"], "--actors: expected an integer from 1 to 256")]
    for args, needle in cases:
        rc, out, err = _main(args, capfd)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)
    with monkeypatch.context() as m:  # Ray not installed: how to install it, in one line
        m.setitem(sys.modules, "ray.data.llm", None)
        rc, out, err = _main([*run, "--engine", "ray"], capfd)
        assert rc == 2 and "pip install 'evaluator[ray]'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o.jsonl").exists()
