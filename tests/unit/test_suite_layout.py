"""The suite's own house rules, checked on its source (AST), each failure naming file and line: every test file is in
tests/unit or tests/integration; no test touches `sys.path` (pyproject.toml's `pythonpath` puts tests/ and the
repository on it); the CLI helper `run_cli` is defined once (helpers/cli.py); every child process is started by
helpers/procs.py (in its own process group, stopped by it), but the commands run_cli's fork server forks (each in a
session of its own, helpers/forkserver.py); no test imports another test module (shared code lives
in helpers/), but the transport parity module, which runs unit tests again on a socket; tests/unit calls no
`time.sleep` (its conftest refuses one at run time too)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from helpers import REPO

TESTS = REPO / "tests"
PROCS = TESTS / "helpers" / "procs.py"
PARITY = TESTS / "integration" / "test_transport_parity.py"  # re-runs unit tests with `any_sim` on the socket
# run_cli's fork server (started by helpers/procs.py) forks each command into a new session of its own
FORKSERVER = TESTS / "helpers" / "forkserver.py"
# Calls that start a process: only helpers/procs.py makes them.
STARTS = {("subprocess", "Popen"), ("subprocess", "run"), ("subprocess", "call"), ("subprocess", "check_call"),
          ("subprocess", "check_output"), ("subprocess", "getoutput"), ("os", "system"), ("os", "fork"),
          ("os", "posix_spawn"), ("os", "popen"), ("asyncio", "create_subprocess_exec"),
          ("asyncio", "create_subprocess_shell"), ("multiprocessing", "Process"), ("ctx", "Process")}


def _files() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(TESTS.rglob("*.py")):
        if "fixtures" not in path.relative_to(TESTS).parts:  # recorded bodies and plugins, not the suite's code
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"


def _dotted(node: ast.AST) -> tuple[str, ...]:
    """`a.b.c` as ("a", "b", "c"); () for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return ()


def test_every_test_file_is_a_unit_or_an_integration_test() -> None:
    loose = [str(p.relative_to(REPO)) for p in TESTS.rglob("test_*.py")
             if p.relative_to(TESTS).parts[0] not in ("unit", "integration")]
    assert not loose, f"test files outside tests/unit and tests/integration: {loose}"


def test_no_test_touches_sys_path() -> None:
    bad = [_where(path, node) for path, tree in _files() for node in ast.walk(tree)
           if isinstance(node, ast.Call) and (_dotted(node.func)[:2] == ("sys", "path")
                                              or _dotted(node.func)[-1:] == ("addsitedir",))]
    assert not bad, f"sys.path changed (pyproject.toml's pythonpath puts tests/ and the repository on it): {bad}"


def test_run_cli_is_defined_once() -> None:
    defined = [_where(path, node) for path, tree in _files() for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "run_cli"]
    assert len(defined) == 1 and defined[0].startswith("tests/helpers/cli.py:"), (
        f"run_cli defined {len(defined)} times ({defined}): the one CLI helper is helpers/cli.py's")


def test_every_child_process_is_started_by_helpers_procs() -> None:
    bad = []
    for path, tree in _files():
        if path == PROCS:
            continue
        for node in ast.walk(tree):
            if path == FORKSERVER and isinstance(node, ast.Call) and _dotted(node.func) == ("os", "fork"):
                continue
            if isinstance(node, ast.Call) and _dotted(node.func)[-2:] in STARTS:
                bad.append(f"{_where(path, node)} ({'.'.join(_dotted(node.func))})")
    assert not bad, ("a process started outside helpers/procs.py (start, run, started, simulator: its own process "
                     f"group, stopped by it): {bad}")


def test_no_test_imports_another_test_module() -> None:
    bad = []
    for path, tree in _files():
        if path == PARITY:
            continue
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{_where(path, node)} ({n})" for n in names
                    if n.split(".")[-1].startswith("test_") or n.split(".")[0] in ("unit", "integration")]
    assert not bad, f"a test module imported by another (shared code lives in tests/helpers): {bad}"


def test_no_sleep_in_a_unit_test() -> None:
    bad = [_where(path, node) for path, tree in _files() if path.relative_to(TESTS).parts[0] == "unit"
           for node in ast.walk(tree) if isinstance(node, ast.Call) and _dotted(node.func) == ("time", "sleep")]
    assert not bad, f"time.sleep in tests/unit (wait on an event or the virtual clock, helpers/clock.py): {bad}"


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    src = ("import subprocess, sys, time\nsys.path.insert(0, 'x')\nsubprocess.run(['x'])\ntime.sleep(1)\n"
           "def run_cli(): ...\nfrom integration.test_x import y\n")
    tree = ast.parse(src)
    calls = [_dotted(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert ("sys", "path", "insert") in calls and ("subprocess", "run") in calls and ("time", "sleep") in calls
    assert [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)] == ["run_cli"]
    assert [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] == ["integration.test_x"]
