"""A study in a process where faiss cannot be imported runs on torch's exact search and gives the lists faiss
gives (the CLI, each side in a child process with its own cache)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.cli import CLI
from helpers.data import make_data_dir
from helpers.procs import child_env, run

# A Python start-up hook that makes `import faiss` fail, as on a machine without it.
NO_FAISS = '''import sys


class _NoFaiss:
    def find_spec(self, name, path=None, target=None):
        if name == "faiss" or name.startswith("faiss."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoFaiss())
'''


def _study(data: Path, root: Path, *, hide_faiss: bool) -> tuple[dict, list[dict]]:
    hook = root / "hook"
    hook.mkdir(parents=True)
    if hide_faiss:
        (hook / "sitecustomize.py").write_text(NO_FAISS, encoding="utf-8")
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])  # its sitecustomize first
    out = root / "out"
    done = run([*CLI, "--data", str(data), "--model", "sim", "--runs", "1", "--cache-dir", str(root / "cache"),
                "--out", str(out), "--no-progress", "--no-extras"], cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (out / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    return meta, records


def test_the_study_runs_without_faiss_on_the_torch_search_with_the_same_lists(tmp_path: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    meta, records = _study(data, tmp_path / "without", hide_faiss=True)
    assert meta["runtime"]["search"] == "torch exact top-k (cpu)"
    assert "peak_gpu_mib" not in meta["runtime"]  # no GPU: nothing to state
    with_meta, with_records = _study(data, tmp_path / "with", hide_faiss=False)  # its own cache: searched anew
    assert with_meta["runtime"]["search"] == "faiss IndexFlatIP (cpu)"

    def lists(recs: list[dict]) -> dict:
        return {(r["subset"], r["query_id"]): (r["archs"]["rtp"]["retrieved"], r["archs"]["ptr"]["retrieved"],
                                               r["archs"]["ptr"]["stub_hits"]) for r in recs}

    assert lists(records) == lists(with_records) and len(records) == 5
    assert all(r["archs"]["rtp"]["retrieved"] for r in records)
