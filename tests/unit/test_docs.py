"""Docs that cannot drift: every module, file, setting, constant, section and command-line flag named in README.md,
docs/*.md, bench/README.md and the docstrings and comments of evaluator/ and simulator/ exists; the code's
docstrings and comments tell no measurement (bench/README.md's "Why the code is as it is" holds the figures);
and what docs/DESIGN.md states as a rule of the types (every `# type: ignore` and every field typed `Any` says
why) holds. A count the docs would have to keep up to date is not written there at all.

What counts as a name (each failure says file:line, the name and what is missing):
- a file path: `evaluator/llm/cache.py`, `configs/models/<name>.toml` (a placeholder `<...>`, `NAME` or `*` is
  any name, `{a,b}` either), `llm/reply.py` (a stage's module, under `evaluator/`), a bare `cache_layout.py`
  (in the code's own text a module of evaluator/ or simulator/, in the docs any file of the repository);
- a dotted module of ours and what it names: `llm.reply`, `core.redact.scrub`, `evaluator.app.run_study`,
  `schema.Meta.study_view` (a module's own name is enough: they are unique), `simulator.harness`, `bench.common`,
  `Record.grade` (a class of ours and its field or method); `retrieval.k`, `settings.data.split` and
  `[run] route_tau` are settings: the section must have the key;
- a backticked `snake_case` name: some identifier, string or TOML key of the code holds it;
- a constant's value (`WINDOW` (1,024), `HELD` = 8,000): the constant's;
- a section pointed to (`bench/README.md, "Warm rerun"`, `see "Retrievers" below`): a heading or a bold title;
- a flag: `--rpm` must be an option of some parser of ours (every command of `python -m evaluator`, built by
  `cli.main.PARSERS`; `python -m simulator`; `python -m evaluator.llamacpp`; the benchmarks'); on a command line
  (`python -m evaluator requests run ... --engine ray`, `python -m bench.view --baseline DIR`) an option of that
  very command, and `python -m bench NAME` a benchmark.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import re
import tokenize
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path

import pytest

from evaluator.cli.main import PARSERS
from evaluator.settings.invocation import Invocation
from evaluator.settings.load import INVOCATION_KEYS
from evaluator.settings.sections import Settings
from simulator.__main__ import _parser as simulator_parser

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())  # wherever tests/ nests
DOCS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")), "bench/README.md")
CODE = ("evaluator", "simulator")  # whose docstrings and comments are read
GENERATED = ("<!-- results:start -->", "<!-- results:end -->")  # bench/README.md's block rendered from result files
PACKAGES = ("evaluator", "simulator", "bench")
STAGES = tuple(sorted(p.name for p in (REPO / "evaluator").iterdir() if (p / "__init__.py").exists()))
TOP = ("evaluator", "simulator", "bench", "tests", "configs", "examples", "docs", ".ci")
# Named in the docs but made by a run, not kept in the repository.
MADE_BY_A_RUN = ("bench/.cache",  # the benchmarks' own embeddings, git-ignored
                 "bench/results/gpu.json")  # written by `python -m bench.gpu_run --collect` once the GPU bench ran
# File extensions: `queries.jsonl`, `cache.db` are files, not a module's attribute.
EXTENSIONS = {"json", "jsonl", "md", "html", "py", "toml", "csv", "tsv", "txt", "png", "gz", "js", "npz", "db",
              "log", "sqlite", "trec", "spill", "lock", "damaged", "unsealed", "safetensors", "gguf", "sh", "whl"}
# Dotted words of the docs that are keys of a saved file or of a third party, not our modules.
NOT_MODULES = {
    "registry.digest",  # meta.json's registry block (`Registry.digest()` fills it)
    "openai.AsyncOpenAI",  # the openai SDK's client
    "beir.retrieval.models.SentenceBERT.encode_corpus",  # the BEIR library's
}
# Flags of other programs the docs name in prose.
THEIRS = {
    "--ctx-size", "--parallel",  # llama.cpp's server
    "--no-deps",  # pip
    "--strict",  # mypy
}
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)  # what may have a docstring


@dataclass(frozen=True)
class Line:
    where: str  # file:line
    text: str
    code: bool  # a line of a fenced code block: a command line


def doc_lines(rel: str) -> Iterator[Line]:
    """A Markdown file's lines, the generated results block left out (it is rendered from the result files)."""
    fenced = generated = False
    for n, text in enumerate((REPO / rel).read_text().splitlines(), 1):
        if text.strip() in GENERATED:
            generated = text.strip() == GENERATED[0]
            continue
        if text.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not generated:
            yield Line(f"{rel}:{n}", text, fenced)


def _docstrings(tree: ast.Module) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, DOCUMENTED) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                yield first.value


def source_text(rel: str, source: str) -> Iterator[Line]:
    """A Python file's docstrings and comments, line by line."""
    for doc in _docstrings(ast.parse(source)):
        for i, text in enumerate(str(doc.value).splitlines()):
            yield Line(f"{rel}:{doc.lineno + i}", text, False)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield Line(f"{rel}:{tok.start[0]}", tok.string.lstrip("#"), False)


def code_files() -> Iterator[tuple[str, Path]]:
    for root in CODE:
        for p in sorted((REPO / root).rglob("*.py")):
            yield str(p.relative_to(REPO)), p


@cache
def all_lines() -> tuple[Line, ...]:
    docs = (line for rel in DOCS for line in doc_lines(rel))
    return (*docs, *(line for rel, p in code_files() for line in source_text(rel, p.read_text())))


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


# ---------------------------------------------------------------------------------------------- file paths

PATH = re.compile(r"(?<![\w./~$-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./<>*{},-]*)")
STAGE_PATH = re.compile(r"(?<![\w./~$-])((?:" + "|".join(STAGES) + r")/[\w/]*\.py)\b")
BARE_FILE = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*\.py)\b")
PLACEHOLDER = re.compile(r"<[^>/]*>|\b[A-Z]{3,}\b|\*")


def _globs(path: str) -> list[str]:
    """`a/{b,c}/<name>.json` -> the glob patterns it stands for."""
    path = PLACEHOLDER.sub("*", path)
    parts = re.split(r"\{([^{}]*)\}", path)
    return ["".join(p) for p in product(*[[x] if i % 2 == 0 else x.split(",") for i, x in enumerate(parts)])]


def path_exists(path: str) -> bool:
    if path.startswith(MADE_BY_A_RUN):
        return True
    folder = path.endswith("/")
    for pattern in _globs(path.rstrip("/")):
        hits = [REPO / pattern] if "*" not in pattern else list(REPO.glob(pattern))
        if any(h.is_dir() if folder else h.exists() for h in hits):
            return True
    return False


@cache
def _file_names() -> frozenset[str]:
    return frozenset(p.name for top in ("evaluator", "simulator", "bench", "tests", "examples", ".ci")
                     for p in (REPO / top).rglob("*.py"))


@cache
def _module_names() -> frozenset[str]:
    return frozenset(p.name for top in ("evaluator", "simulator") for p in (REPO / top).rglob("*.py"))


def path_offences(line: Line) -> list[str]:
    out = []
    for m in PATH.finditer(line.text):
        path = m.group(1).rstrip(".,;:)")
        if "..." in path or "…" in path or path.endswith("/*"):
            continue
        if not path_exists(path):
            out.append(f"{line.where}: {path} does not exist")
    for m in STAGE_PATH.finditer(line.text):
        if not (REPO / "evaluator" / m.group(1)).exists():
            out.append(f"{line.where}: {m.group(1)} is no module of evaluator/")
    # the code's own text names a bench or test file with its folder: a bare name there is a module of ours
    ours = line.where.startswith(CODE)
    names = _module_names() if ours else _file_names()
    for m in BARE_FILE.finditer(line.text):
        if m.group(1) not in names and m.group(1) != "file.py":  # `file.py:Class`: a plugin's form
            out.append(f"{line.where}: no {'module of evaluator/ or simulator/' if ours else 'file'} is named "
                       f"{m.group(1)}")
    return out


# ------------------------------------------------------------------------------------- modules and their names


def _module_files() -> dict[str, Path]:
    """Every module and package of ours, by dotted name."""
    out = {}
    for top in PACKAGES:
        for p in (REPO / top).rglob("*.py"):
            parts = p.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULE_FILES = _module_files()


def _short_names() -> dict[str, list[str]]:
    """A module's last name -> its dotted names (`reply` -> evaluator.llm.reply; module names are unique)."""
    out: dict[str, list[str]] = {}
    for name in MODULE_FILES:
        if not name.startswith("bench"):  # bench's modules are named `bench.x`
            out.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return out


SHORT = _short_names()
SECTIONS = tuple(f.name for f in dataclasses.fields(Settings))  # data, embed, retrieval, run, analysis


@cache
def _section_keys(section: str) -> frozenset[str]:
    """A settings table's keys: its section's fields, and the invocation's options the table may hold."""
    keys = {f.name for f in dataclasses.fields(getattr(Settings(), section))}
    return frozenset(keys | set(INVOCATION_KEYS.get(section, ())) & {f.name for f in dataclasses.fields(Invocation)})


def _tree(module: str) -> ast.Module:
    return parsed(MODULE_FILES[module])


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


@cache
def _top_names(module: str) -> dict[str, ast.AST]:
    """A module's own names: what it defines, assigns and imports (also under `if` and `try`), and a package's
    modules."""
    out: dict[str, ast.AST] = {}
    for top in _tree(module).body:
        for node in ast.walk(top) if isinstance(top, ast.If | ast.Try) else [top]:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                for t in _targets(node):
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            out[n.id] = node
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for a in node.names:
                    out[(a.asname or a.name).split(".")[0]] = node
    for sub in MODULE_FILES:
        if sub.rpartition(".")[0] == module:
            out.setdefault(sub.rpartition(".")[2], _tree(sub))
    return out


def _class_names(cls: ast.ClassDef) -> set[str]:
    """A class's own names: fields, methods, nested classes, and what its methods set on `self`."""
    out = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            out |= {t.id for t in _targets(node) if isinstance(t, ast.Name)}
    for n in ast.walk(cls):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            out.add(n.attr)
    return out


def _defined(module: str, name: str) -> tuple[str, ast.AST | None]:
    """Where `name` of `module` is defined: (module, node), following one `from x import name` of ours."""
    node = _top_names(module).get(name)
    if isinstance(node, ast.ImportFrom) and node.module in MODULE_FILES and name in _top_names(node.module):
        return node.module, _top_names(node.module)[name]
    return module, node


PLAIN_BASES = {"object", "Protocol", "NamedTuple", "Generic", "Enum", "StrEnum"}  # they add no name a doc cites


def _class_has(module: str, cls: ast.ClassDef, attr: str) -> bool:
    """Whether a class (or one of its bases) has `attr`; True when a base is not ours (it may come from there)."""
    if attr in _class_names(cls):
        return True
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else None
        if name in PLAIN_BASES:
            continue
        where, node = _defined(module, name) if name else (module, None)
        if not isinstance(node, ast.ClassDef) or _class_has(where, node, attr):
            return True
    return False


def _resolves(module: str, attrs: list[str]) -> str | None:
    """None when `module.attrs...` exists (checked two names deep); else what is missing."""
    if not attrs:
        return None
    where, node = _defined(module, attrs[0])
    if node is None:
        return f"{module} has no {attrs[0]}"
    if len(attrs) > 1 and isinstance(node, ast.ClassDef) and not _class_has(where, node, attrs[1]):
        return f"{module}.{attrs[0]} has no {attrs[1]}"
    return None


def _classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class of ours by name -> (module, its definition)."""
    out: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for module in MODULE_FILES:
        for node in ast.walk(_tree(module)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append((module, node))
    return out


CLASSES = _classes()


def class_offence(name: str) -> str | None:
    """`Record.grade`, `LLMEngine.store_reply`: the class's own names (or its bases'); None when it has it."""
    cls, attr = name.split(".")[:2]
    if any(_class_has(module, node, attr) for module, node in CLASSES[cls]):
        return None
    return f"{cls} has no {attr}"


DOTTED = re.compile(r"(?<![\w./-])((?:[a-z_][a-z0-9_]*)(?:\.[A-Za-z_]\w*)+)")
CLASS_ATTR = re.compile(r"(?<![\w.])([A-Z]\w*\.[A-Za-z_]\w*)")


def dotted_offence(name: str) -> str | None:
    """None when a dotted word names nothing of ours or names something that exists; else what is missing."""
    parts = name.split(".")
    if name in NOT_MODULES or any(p in EXTENSIONS for p in parts[1:]):
        return None
    if parts[0] == "settings" and len(parts) > 1 and parts[1] in SECTIONS:  # meta.json's `settings.data.split`
        return None if len(parts) == 2 or parts[2] in _section_keys(parts[1]) else f"[{parts[1]}] has no {parts[2]}"
    if parts[0] in SECTIONS and len(parts) == 2 and parts[1] in _section_keys(parts[0]):  # `retrieval.k`
        return None
    if parts[0] in PACKAGES:
        candidates = [parts]
    elif parts[0] in SHORT:
        candidates = [full.split(".") + parts[1:] for full in SHORT[parts[0]]]
    else:
        return None  # not ours (`ctx.search`, `np.float32`)
    misses = []
    for cand in candidates:
        for cut in range(len(cand), 0, -1):
            module = ".".join(cand[:cut])
            if module in MODULE_FILES:
                if (miss := _resolves(module, cand[cut:])) is None:
                    return None
                misses.append(miss)
                break
        else:
            misses.append(f"no module {'.'.join(cand)}")
    return "; ".join(misses)


def module_offences(line: Line) -> list[str]:
    out = []
    for m in DOTTED.finditer(line.text):
        first = m.group(1).split(".")[0]
        if (first in PACKAGES or first in SHORT or first in SECTIONS) and (why := dotted_offence(m.group(1))):
            out.append(f"{line.where}: `{m.group(1)}`: {why}")
    for m in CLASS_ATTR.finditer(line.text):
        if m.group(1).split(".")[0] in CLASSES and (why := class_offence(m.group(1))):
            out.append(f"{line.where}: `{m.group(1)}`: {why}")
    return out


# `[run] route_tau`; a key without `_` only in backticks (`[run] archs`), so "the [run] section" is prose
SETTING = re.compile(r"`\[(" + "|".join(SECTIONS) + r")\] ([a-z_]+)`|\[(" + "|".join(SECTIONS)
                     + r")\]`? `?([a-z]+_[a-z_]+)")


def setting_offences(line: Line) -> list[str]:
    return [f"{line.where}: [{s or s2}] has no key {k or k2}" for s, k, s2, k2 in SETTING.findall(line.text)
            if (k or k2) not in _section_keys(s or s2)]


# ------------------------------------------------------------------------------------- identifiers in backticks

# Backticked names the code does not hold as such (a name made by an f-string, `http_503`, counts as held).
NOT_IN_CODE = {
    "embed_threads",  # a setting of formats 0-2, dropped by the migration (results/migrate.py says so)
    "top_k",  # a field of Anthropic's Messages API, passed through as the user gives it
    "get_player_transfers",  # an example of a stub's name
}
IDENTIFIER = re.compile(r"`([a-z][a-z0-9]*_[a-z0-9_]*)`")
IDENTIFIER_DOCS = tuple(d for d in DOCS if d != "bench/README.md")  # that one quotes other programs' names


def _toml_words(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _toml_words(v)
    elif isinstance(value, list):
        for v in value:
            yield from _toml_words(v)
    elif isinstance(value, str):
        yield from re.findall(r"\w+", value)


@cache
def code_words(tops: tuple[str, ...]) -> frozenset[str]:
    """Every name the code under `tops` holds: its modules, identifiers, the words of its strings (docstrings
    aside), and the keys and values of the TOML files."""
    words: set[str] = set()
    for top in tops:
        for p in (REPO / top).rglob("*.py"):
            words.add(p.stem)
            tree = parsed(p)
            docstrings = {id(d) for d in _docstrings(tree)}
            for n in ast.walk(tree):
                if isinstance(n, ast.Name):
                    words.add(n.id)
                elif isinstance(n, ast.Attribute):
                    words.add(n.attr)
                elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    words.add(n.name)
                elif isinstance(n, ast.arg | ast.keyword) and n.arg:
                    words.add(n.arg)
                elif isinstance(n, ast.alias):
                    words.update((n.asname or n.name).split("."))
                elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
                    words.update(re.findall(r"\w+", n.value))
    for p in [*(REPO / "configs").rglob("*.toml"), REPO / "pyproject.toml"]:
        words.update(_toml_words(tomllib.loads(p.read_text())))
    return frozenset(words)


@cache
def made_names(tops: tuple[str, ...]) -> re.Pattern[str]:
    """The names the code makes with an f-string (`f"http_{status}"`, `f"tokens_{call}_{kind}"`), as one pattern."""
    shapes = set()
    for top in tops:
        for p in (REPO / top).rglob("*.py"):
            for n in ast.walk(parsed(p)):
                if isinstance(n, ast.JoinedStr):
                    literal = "".join(str(v.value) for v in n.values if isinstance(v, ast.Constant))
                    if re.fullmatch(r"[a-z_]*", literal) and sum(c.isalpha() for c in literal) >= 3:
                        shapes.add("".join(re.escape(str(v.value)) if isinstance(v, ast.Constant) else r"\w+"
                                           for v in n.values))
    return re.compile("|".join(sorted(shapes)))


def identifier_offences(line: Line) -> list[str]:
    """A backticked `snake_case` name (a module, function, field, key) the code no longer holds: the code's own
    text names the evaluator's and the simulator's names, the docs those of the tests and benchmarks too."""
    if line.where.startswith(CODE):
        tops: tuple[str, ...] = ("evaluator", "simulator")
    elif line.where.startswith(IDENTIFIER_DOCS):
        tops = ("evaluator", "simulator", "bench", "tests")
    else:
        return []
    return [f"{line.where}: `{w}` is no name the code holds" for w in IDENTIFIER.findall(line.text)
            if w not in code_words(tops) and w not in NOT_IN_CODE and not made_names(tops).fullmatch(w)]


# ------------------------------------------------------------------------------------------ constants' values

CONSTANT_VALUE = re.compile(r"`([A-Z][A-Z0-9_]{2,})`(?: \(| = | is )(\d[\d,_]*(?:\.\d+)?)")


def _number(node: ast.expr) -> float | None:
    """The value of a constant's literal (`1024`, `8_000`, `1 << 17`, `0.25`), None when it is not a number."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and (a := _number(node.left)) is not None and (b := _number(node.right)) is not None:
        ops: dict[type, Callable[[], float]] = {ast.Mult: lambda: a * b, ast.LShift: lambda: int(a) << int(b),
                                                ast.Add: lambda: a + b, ast.Sub: lambda: a - b}
        return ops[type(node.op)]() if type(node.op) in ops else None
    return None


@cache
def constants() -> dict[str, set[float]]:
    """Every module-level constant of ours with a number for its value, by name."""
    out: dict[str, set[float]] = {}
    for path in MODULE_FILES.values():
        for node in parsed(path).body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                for t in _targets(node):
                    if isinstance(t, ast.Name) and (v := _number(node.value)) is not None:
                        out.setdefault(t.id, set()).add(v)
    return out


def constant_offences(line: Line) -> list[str]:
    """`WINDOW` (1,024), `HELD` = 8,000: the value a text gives one of our constants is its value."""
    return [f"{line.where}: `{name}` is {sorted(constants()[name])}, not {value}"
            for name, value in CONSTANT_VALUE.findall(line.text)
            if name in constants() and float(value.replace(",", "").replace("_", "")) not in constants()[name]]


# ------------------------------------------------------------------------------------------ section pointers

# `bench/README.md, "Warm rerun"`, `see "Retrievers" below`: the section a text points to (a heading or a bold
# paragraph title that starts so)
TO_BENCH = re.compile(r"bench/README\.md`?,?\s*\(?\"([^\"]+)\"")
IN_FILE = re.compile(r"\bsee \"([^\"]+)\"(?: in ((?:docs/)?[A-Z]+)\b)?|\"([^\"]+)\"\)? (?:below|above)")


@cache
def section_titles(rel: str) -> tuple[str, ...]:
    text = (REPO / rel).read_text().replace("`", "")
    return tuple(re.findall(r"^#+ (.+)$", text, re.M) + re.findall(r"^\*\*([^*]+)\*\*", text, re.M))


def pointer_offences(line: Line) -> list[str]:
    here = line.where.rsplit(":", 1)[0]
    wanted = [("bench/README.md", t) for t in TO_BENCH.findall(line.text)]
    if here.endswith(".md"):  # `see "X"` in this file, or `see "X" in README`
        wanted += [(f"{there}.md" if there else here, a or b) for a, there, b in IN_FILE.findall(line.text)]
    return [f"{line.where}: {rel} has no section \"{title}\"" for rel, title in wanted
            if not any(t.startswith(title.replace("`", "")) for t in section_titles(rel))]


# ------------------------------------------------------------------------------------------------------ flags


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _static_flags(path: Path) -> set[str]:
    """The flags a module adds to an argparse parser (read from the source: bench's modules import heavy things)."""
    out = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return out | {"-h", "--help"}


@cache
def command_flags() -> dict[str, set[str]]:
    """Each of our commands -> its options: `evaluator report`, `simulator`, `bench.view`, ..."""
    out = {f"evaluator {name}": _options(make()) for name, make in PARSERS.items()}
    out["simulator"] = _options(simulator_parser())
    out["evaluator.llamacpp"] = _static_flags(REPO / "evaluator/llamacpp/__main__.py")
    for p in sorted((REPO / "bench").glob("*.py")):
        out[f"bench.{p.stem}" if p.stem != "__main__" else "bench"] = _static_flags(p)
    return out


@cache
def known_flags() -> set[str]:
    return set().union(*command_flags().values()) | THEIRS


@cache
def benchmarks() -> frozenset[str]:
    """`python -m bench NAME`'s names: the keys of `bench.common.BENCHMARKS` (read from the source)."""
    for node in parsed(REPO / "bench/common.py").body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BENCHMARKS" for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise AssertionError("bench/common.py has no BENCHMARKS")


FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
SUBCOMMANDS = sorted((k.removeprefix("evaluator ") for k in PARSERS), key=len, reverse=True)
PYTHON_M = re.compile(r"^(?:\S*python3?)\s+-m\s+(\S+)\s*(.*)$")
PYTHON_FILE = re.compile(r"^(?:\S*python3?)\s+(bench/\w+)\.py\b\s*(.*)$")


def command_of(words: str) -> tuple[str, str] | None:
    """A command line (`VAR=x python -m evaluator requests run IN --engine ray`) -> (our command, its arguments),
    None for another program's."""
    words = re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+", "", words.strip())
    m = PYTHON_M.match(words) or PYTHON_FILE.match(words)
    if m is None:
        return None
    module, rest = m.group(1).replace("/", "."), m.group(2)
    if module == "evaluator":
        sub = next((s for s in SUBCOMMANDS if rest == s or rest.startswith(s + " ")), "run")
        return f"evaluator {sub}", rest
    return (module, rest) if module.split(".")[0] in PACKAGES else None


def command_offences(where: str, name: str, rest: str) -> list[str]:
    """The flags of one of our command lines, and `python -m bench`'s benchmark names."""
    if name not in command_flags():
        return [f"{where}: no command `python -m {name}`"]
    out = [f"{where}: {flag} is no option of `{name}`" for flag in FLAG.findall(QUOTED.sub("", rest))
           if flag not in command_flags()[name]]  # a quoted argument is a value (checked with the prose's)
    if name == "bench":
        out += [f"{where}: `python -m bench` has no benchmark {w}" for w in rest.split()
                if re.fullmatch(r"[a-z_]+", w) and w not in benchmarks()]
    return out


def flag_offences(line: Line) -> list[str]:
    out = []
    checked: set[int] = set()
    # a command line: in a code block, or an inline `python -m ...` span
    spans = ([line.text] if line.code else []) + [s for s in re.findall(r"`([^`]+)`", line.text) if " -m " in s]
    for span in spans:
        for part in re.split(r"\s(?:&&|\||;)\s", span.split(" # ")[0]):
            start = line.text.find(part)
            cmd = command_of(part)
            if cmd is not None:
                out += command_offences(line.where, *cmd)
            elif not PYTHON_M.match(part) and not line.code:
                continue  # prose in backticks: its flags are checked against every command's
            # this command's flags are checked (or another program's, `python -m llama_cpp.server --n_ctx`, are its
            # own), but for a quoted argument's, as those of prose
            quoted = {i for q in QUOTED.finditer(part) for i in range(start + q.start(), start + q.end())}
            checked |= set(range(start, start + len(part))) - quoted
    for m in FLAG.finditer(line.text):
        if m.start() not in checked and m.group(1) not in known_flags():
            out.append(f"{line.where}: {m.group(1)} is no option of any command")
    return out


# ------------------------------------------------------------------------------------------------------ tests

CHECKS = (path_offences, module_offences, setting_offences, identifier_offences, constant_offences, flag_offences)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_every_name_in_the_docs_and_docstrings_exists(check) -> None:
    offences = [o for line in all_lines() for o in check(line)]
    assert not offences, f"{len(offences)} names that do not exist:\n" + "\n".join(offences)


def paragraphs() -> Iterator[Line]:
    """The docs' paragraphs and the code's docstrings and comment blocks, each as one line (a pointer may wrap)."""
    for rel in DOCS:
        block: list[Line] = []
        for line in [*doc_lines(rel), Line("", "", False)]:
            if line.text.strip():
                block.append(line)
            elif block:
                yield Line(block[0].where, " ".join(b.text.strip() for b in block), False)
                block = []
    for rel, p in code_files():
        for n, text in passages(p.read_text()):
            yield Line(f"{rel}:{n}", " ".join(text.split()), False)


def test_every_section_pointed_to_exists() -> None:
    offences = [o for line in paragraphs() for o in pointer_offences(line)]
    assert not offences, "\n".join(offences)


PLANTED = [  # (check, text, a code block's line, where it is written, whether it is an offence)
    (module_offences, "the reply is read in `llm.replies`", False, "README.md:1", True),
    (module_offences, "`core.redact.scrubber` cuts keys", False, "README.md:1", True),
    (module_offences, "`core.redact.scrub`, `llm.reply` and `schema.Meta.study_view`", False, "README.md:1", False),
    (module_offences, "`Record.grades_of(id)`", False, "README.md:1", True),
    (module_offences, "`Record.grade` and `LLMEngine.store_reply`", False, "README.md:1", False),
    (module_offences, "`retrieval.kk` is the budget", False, "README.md:1", True),
    (module_offences, "`retrieval.k` and `settings.data.split`", False, "README.md:1", False),
    (path_offences, "see `evaluator/llm/replies.py`", False, "README.md:1", True),
    (path_offences, "in `llm/replies.py`", False, "README.md:1", True),
    (path_offences, "`configs/models/<name>.toml`, `tests/fixtures/` and `core/cache_layout.py`", False,
     "README.md:1", False),
    (path_offences, "the exports (see embed_backends.py)", False, "evaluator/core/files.py:5", True),
    (constant_offences, "at most `WINDOW` (2,048) queries", False, "README.md:1", True),
    (constant_offences, "at most `WINDOW` (1,024) queries, `HELD` = 8,000, `JITTER_S` (0.4 s)", False,
     "README.md:1", False),
    (setting_offences, "`[run] route_taus` sets it", False, "README.md:1", True),
    (setting_offences, "`[run] route_tau` and `[run] archs`, or the [run] section", False, "README.md:1", False),
    (identifier_offences, "the runtime exports (`embed_backends`)", False, "evaluator/core/files.py:5", True),
    (identifier_offences, "the cache (`cache_layout`, `http_503`)", False, "evaluator/core/files.py:5", False),
    (pointer_offences, 'its figures: bench/README.md, "No such section"', False, "evaluator/x.py:1", True),
    (pointer_offences, 'bench/README.md, "Warm rerun"; see "Retrievers" below', False, "README.md:1", False),
    (pointer_offences, 'one run (see "Runs on a deterministic server" in README)', False, "bench/README.md:1", False),
    (pointer_offences, 'one run (see "Runs on a deterministic server")', False, "bench/README.md:1", True),
    (flag_offences, "pass `--rpms 60`", False, "README.md:1", True),
    (flag_offences, "python -m evaluator report OUT --rpm 5", True, "README.md:1", True),
    (flag_offences, "`python -m evaluator view A --engine ray`", False, "README.md:1", True),
    (flag_offences, "python -m bench.view --nope", True, "bench/README.md:1", True),
    (flag_offences, "python -m bench.nothing --check", True, "bench/README.md:1", True),
    (flag_offences, "python -m bench fanout nothing", True, "bench/README.md:1", True),
    (flag_offences, "python -m bench fanout scale --no-readme", True, "bench/README.md:1", False),
    (flag_offences, "GEMINI_API_KEY=x python -m evaluator --rpm 5 --arch-timeout 9  # see --budget", True,
     "README.md:1", False),
    (flag_offences, "python -m evaluator requests run in.jsonl --engine ray --actors 2 && llama-server --np 1",
     True, "README.md:1", False),
    (flag_offences, "run `python -m bench.view --baseline D`; the simulator's `--quote-key`", False, "README.md:1",
     False),
]


@pytest.mark.parametrize(("check", "text", "code", "where", "offence"), PLANTED,
                         ids=[f"{c.__name__}-{i}" for i, (c, *_) in enumerate(PLANTED)])
def test_the_checks_catch_planted_offences(check, text: str, code: bool, where: str, offence: bool) -> None:
    assert bool(check(Line(where, text, code))) == offence, check(Line(where, text, code))


# ------------------------------------------------------------------------------------- measurement history

# A measured quantity: a time, a size, a rate or a ratio (`429s` is a count of statuses, `2 x depth` a product) ...
QUANTITY = re.compile(
    r"\d[\d,.]*(?:\s?-\s?\d[\d,.]*)?(?:\s(?:s|h|min)|\s?(?:µs|ms|minutes?|seconds?|hours?|CPU[- ]s(?:econds?)?|"
    r"[KMG]i?B|%|(?:\w+ )?(?:calls|texts|tokens|tok|requests)/(?:s|min)|GB/s)|[x×])(?![\w/])")
# ... told as what happened: measured, a bench, before and after, what a run took or held.
NARRATIVE = re.compile(
    r"\b(?:measured|bench(?:mark)?s?\b|bench/|took|held|was|were|before(?=[),;.:]|$)|vs\.?|load(?: average)? \d|"
    r"first run|warm (?:study|rerun|run)|cold|saved|gave|grew|ran at|peaked|costs? ~?\d|"
    r"of a [\w,-]+ (?:study|rerun|run))", re.I)
# Figures that are a rule the code keeps, not a measurement's history: module -> the words that may stay.
REASONS: dict[str, tuple[str, ...]] = {
    # the equivalence criterion a runtime path must meet to be taken by `auto`
    "evaluator/retrieval/embed.py": ("RtP recall@1..20 within 0.005, >= 98% identical top-5 lists",),
}


def narratives(text: str) -> list[str]:
    """The sentences of a docstring or comment that tell a measurement: a quantity and a narrative cue."""
    flat = TO_BENCH.sub("", " ".join(text.split()))  # a pointer to the figures is no figure
    return [s for s in re.split(r"(?<=[.;!?])\s+(?=[A-Z(`])", flat) if QUANTITY.search(s) and NARRATIVE.search(s)]


def passages(source: str) -> Iterator[tuple[int, str]]:
    """A module's docstrings, and its comments joined in blocks of consecutive lines: (first line, text)."""
    for doc in _docstrings(ast.parse(source)):
        yield doc.lineno, str(doc.value)
    block: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        if block and block[-1][0] != tok.start[0] - 1:
            yield block[0][0], " ".join(t for _, t in block)
            block = []
        block.append((tok.start[0], tok.string.lstrip("#")))
    if block:
        yield block[0][0], " ".join(t for _, t in block)


def measurement_offences(rel: str, source: str) -> list[str]:
    allowed = REASONS.get(rel, ())
    return [f"{rel}:{line}: {s}" for line, text in passages(source) for s in narratives(text)
            if not any(a in s for a in allowed)]


def test_no_measurement_history_in_the_code() -> None:
    """A measurement (`took 1.9 s of a warm study`, `held 266 MiB`, `1.42x the floor in bench/fanout`) goes to
    bench/README.md, "Why the code is as it is"; the code keeps its reason and a pointer there."""
    offences = [o for rel, p in code_files() for o in measurement_offences(rel, p.read_text())]
    assert not offences, ("measurements told in docstrings or comments; move the figures to bench/README.md "
                          "(\"Why the code is as it is\") and point there:\n" + "\n".join(offences))


def test_the_measurement_check_catches_planted_history() -> None:
    told = '''"""Scores every candidate at once (4,733 calls took 1.9 s of a warm study)."""
# the list itself held ~1 KiB per query
Y = 0
X = 1  # 1.42x the floor in bench/fanout.py
'''
    assert len(measurement_offences("evaluator/x.py", told)) == 3
    reasons = '''"""Scores every candidate at once (bench/README.md, "x.py"); at most 256 MB per batch, split to fit."""
# Slurm waits 30 s; 429s are counted; a 2x slower answer ends slow start
'''
    assert measurement_offences("evaluator/x.py", reasons) == []


# ------------------------------------------------------------------------- what docs/DESIGN.md says as a rule

IGNORE = re.compile(r"#\s*type:\s*ignore(\[[\w,-]+\])?(.*)$")


def _said_above(lines: list[str], i: int, same: Callable[[int], bool]) -> bool:
    """A comment on the line above line `i` (from 0), or above the run of lines like it (`same`) that `i` ends."""
    while i > 0 and same(i - 1):
        i -= 1
    return i > 0 and lines[i - 1].strip().startswith("#")


def _comments(line: str) -> bool:
    """Whether a line of code ends in a comment: a `#` outside its strings."""
    quote = None
    for c in line:
        if quote:
            quote = None if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c == "#":
            return True
    return False


def ignore_offences(rel: str, source: str) -> list[str]:
    """`# type: ignore` without its error code, or without a comment saying why (after it, or above)."""
    out, lines = [], source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (m := IGNORE.search(tok.string)):
            i = tok.start[0] - 1
            if m.group(1) is None:
                out.append(f"{rel}:{i + 1}: `# type: ignore` without its error code")
            elif "#" not in m.group(2) and not _said_above(lines, i, lambda j: bool(IGNORE.search(lines[j]))):
                out.append(f"{rel}:{i + 1}: `# type: ignore{m.group(1)}` says not why")
    return out


def any_field_offences(rel: str, source: str) -> list[str]:
    """A class field typed with `Any` and no comment where it is declared (on its line, or above it and the
    fields declared with it)."""
    out, lines = [], source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        fields = {st.lineno - 1 for st in node.body if isinstance(st, ast.AnnAssign)}
        for st in node.body:
            if (isinstance(st, ast.AnnAssign)
                    and any(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(st.annotation))):
                i = st.lineno - 1
                if not (_comments(lines[i]) or _said_above(lines, i, fields.__contains__)):
                    out.append(f"{rel}:{i + 1}: {node.name}.{ast.unparse(st.target)} is typed with Any and says "
                               "not why")
    return out


@pytest.mark.parametrize("check", [ignore_offences, any_field_offences], ids=lambda c: c.__name__)
def test_each_type_escape_says_why(check) -> None:
    """docs/DESIGN.md, "Type checking": every `# type: ignore` carries its code and its reason, every field typed
    with `Any` is a deliberate extension point commented where it is declared."""
    offences = [o for rel, p in code_files() for o in check(rel, p.read_text())]
    assert not offences, "\n".join(offences)


def test_the_type_escape_checks_catch_planted_offences() -> None:
    assert ignore_offences("x.py", "a = b  # type: ignore\n")
    assert ignore_offences("x.py", "a = b  # type: ignore[attr-defined]\n")
    assert not ignore_offences("x.py", "a = b  # type: ignore[attr-defined]  # pydantic adds it\n")
    assert not ignore_offences("x.py", "# pydantic adds both\na = b  # type: ignore[attr-defined]\n"
                                       "c = d  # type: ignore[attr-defined]\n")
    assert any_field_offences("x.py", "class A:\n    body: dict[str, Any]\n")
    assert not any_field_offences("x.py", "class A:\n    body: dict[str, Any]  # a provider's JSON\n")
    assert not any_field_offences("x.py", "class A:\n    # the provider's JSON, both\n    body: dict[str, Any]\n"
                                          "    raw: dict[str, Any]\n")
