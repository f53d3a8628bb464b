"""Canary API keys: one per variable a bundled profile names (and a path profile's), to search written files for."""

from __future__ import annotations

import tomllib

from helpers import REPO

SIM_ENV = "EVALUATOR_TEST_CANARY_SIM_KEY"  # the path profile's api_key_env (not one of configs/models)


def canary(name: str) -> str:
    return f"sk-canary-7f3a-{name.lower().replace('_', '-')}-0c41d9"


def bundled_envs() -> list[str]:
    names = []
    for f in sorted((REPO / "configs" / "models").glob("*.toml")):
        env = tomllib.loads(f.read_text(encoding="utf-8")).get("connection", {}).get("api_key_env")
        if env:
            names.append(env)
    return names
