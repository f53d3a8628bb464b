"""Issue 10's simulator proof: the shipped `local` profile against a one-request-at-a-time server.

The simulator is serial (and keeps working on abandoned requests), cuts replies at max_tokens, and
puts stray lists in prose; the CLI study with `--model local` must finish with no request timing
out and no failed call, and a rerun must send nothing and give the same records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import run_cli
from helpers.data import make_data_dir
from helpers.procs import simulator
from helpers.records import flat


def _profile(root: Path, structured: str) -> str:
    """`local`, or a copy of local.toml (named `local` too) with another `structured` mode."""
    if structured == "json_schema":
        return "local"
    text = (REPO / "configs" / "models" / "local.toml").read_text(encoding="utf-8")
    text = re.sub(r'(?m)^structured = ".*"$', f'structured = "{structured}"', text)
    (root / "local.toml").write_text(text, encoding="utf-8")
    return str(root / "local.toml")


def _study(profile: str, base_url: str, data: Path, cache: Path, out: Path) -> tuple[dict, list[dict]]:
    done = run_cli("--model", profile, "--data", str(data), "--limit", "10", "--runs", "2", "--max-tokens", "400",
                   "--timeout", "30", "--no-progress", "--cache-dir", str(cache), "--out", str(out), cwd=out.parent,
                   env={"LOCAL_BASE_URL": base_url, "LOCAL_MODEL": "tiny-local"})
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((out / "meta.json").read_text())
    # meta.json records every request-shaping setting of the profile, the flags' values included.
    (info,) = [m for m in meta["models"] if m["name"] == "local"]
    assert info["profile"]["base_url"] == base_url and info["profile"]["max_tokens"] == 400
    assert info["profile"]["timeout_s"] == 30 and info["profile"]["structured"] in ("json_schema", "none")
    recs = [flat(json.loads(line)) for line in (out / "queries.jsonl").read_text().splitlines() if line.strip()]
    return meta["llm_stats"]["local"], recs


# json_schema: local.toml as shipped (grammar-shaped replies); none: free text, where the stray lists
# in prose and code (p_stray) reach the parser.
@pytest.mark.parametrize("structured", ["json_schema", "none"])
def test_local_profile_finishes_on_a_serial_server_and_reruns_for_free(tmp_path, structured):
    data, cache = make_data_dir(tmp_path / "data"), tmp_path / "cache"
    profile = _profile(tmp_path, structured)
    knobs = {"serial": True, "latency_s": 0.05, "latency_per_token_s": 0.0005, "p_stray": 0.3,
             "p_runaway": 0.2, "cut_at_max_tokens": True}
    with simulator(**knobs) as sim:
        first, recs1 = _study(profile, sim.base_url, data, cache, tmp_path / "first")
        served = sim.stats()
        assert first["requests"] > 0 and first["timeouts"] == 0 and first["errors"] == 0, first
        assert first["truncated"] > 0  # the cut replies were met, kept and scored
        assert served["abandoned"] == 0, served
        sim.reset_stats()
        again, recs2 = _study(profile, sim.base_url, data, cache, tmp_path / "rerun")
        assert again["requests"] == 0 and sim.stats()["requests"] == 0
    # No stray list became an answer: no stub is a place, no selection is a string from code or prose.
    stubs = {st["name"] for r in recs1 for st in (r.get("ptr") or {}).get("stubs") or []}
    picked = {a for r in recs1 for a in ((r.get("rtp") or {}).get("plan") or {}).get("selected") or []}
    assert stubs and not stubs & {"Paris", "Lyon"}
    assert picked and not picked & {"origin", "a", "b", "none"}
    strip = lambda rs: sorted(json.dumps({k: v for k, v in r.items() if k != "timing"}, sort_keys=True) for r in rs)  # noqa: E731
    assert strip(recs1) == strip(recs2)
