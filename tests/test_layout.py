"""Arrows point down the data flow: analyses never import the renderer, nothing imports the application
or the command line, and only the CLI prints for the user."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "evaluator"

# module (or package) -> evaluator modules it must never import
FORBIDDEN = {
    "analysis": {"render", "app", "cli", "pipeline"},
    "render": {"app", "cli", "pipeline"},
    "schema": {"analysis", "render", "app", "cli", "pipeline"},
    "config": {"analysis", "render", "app", "cli", "pipeline", "schema"},
    "pipeline": {"analysis", "render", "app", "cli"},
    "study": {"analysis", "render", "app", "cli", "pipeline"},
    "app": {"cli"},
}


def _imports(path: Path) -> set[str]:
    """The evaluator modules a file imports, as top-level names under `evaluator` (`render`, `analysis`, ...)."""
    pkg_parts = path.relative_to(PKG.parent).with_suffix("").parts[:-1]  # e.g. ("evaluator", "render")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg_parts[: len(pkg_parts) - node.level + 1])
                mod = base + (node.module.split(".") if node.module else [])
            else:
                mod = (node.module or "").split(".")
            if mod[:1] == ["evaluator"]:
                names = mod[1:2] or [a.name for a in node.names]
                out.update(names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "evaluator" and len(parts) > 1:
                    out.add(parts[1])
    return out


def _files(name: str) -> list[Path]:
    return sorted((PKG / name).glob("*.py")) if (PKG / name).is_dir() else [PKG / f"{name}.py"]


def test_no_upward_imports() -> None:
    bad = []
    for name, forbidden in FORBIDDEN.items():
        for f in _files(name):
            hit = _imports(f) & forbidden
            if hit:
                bad.append(f"{f.relative_to(PKG)} imports {sorted(hit)}")
    assert not bad, bad


def test_checker_sees_relative_imports() -> None:
    assert "analysis" in _imports(PKG / "render" / "tables.py")
    assert {"schema", "llm"} <= _imports(PKG / "pipeline.py")
