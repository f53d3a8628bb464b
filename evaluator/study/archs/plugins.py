"""A user's architecture from `--archs`: `path/to/file.py:ClassName` or `package.module:ClassName`.

Loaded and checked before any paid work: a file or module that does not import, a class that is not there,
cannot be made without arguments, has no `name` or no `async def retrieve(self, ctx)`, or annotates another
return type than `Discovery` is one `ArchError` line naming the flag and the spec (exit 2, no traceback).
What every architecture returns is checked on every query (`check_discovery`, the runner's seam): a breach
fails that query's block (`contract`), first on one probe query before the LLM stage
(`study.runner.probe_archs`, where it stops the study before any paid call).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import numbers
import re
import sys
import typing
from collections.abc import Callable, Container
from pathlib import Path
from types import ModuleType
from typing import Any

from evaluator.core.redact import scrub
from evaluator.llm import ChatResult
from evaluator.results.schema import ArchBlock
from evaluator.study.archs.base import TRACE_MAX_BYTES, ArchError, ArchFailure, Architecture, Discovery

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def is_plugin_spec(spec: str) -> bool:
    return ":" in spec


def _module(target: str, resolve: Callable[[str], Path], spec: str) -> ModuleType:
    if target.endswith(".py"):
        path = resolve(target)
        if not path.is_file():
            raise ArchError(f"--archs {spec}: no file {target}; pass path/to/file.py:ClassName.")
        # one module per file, named by its path: loading it again (the dry run, the collect pass) reuses it
        name = "evaluator_arch_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ArchError(f"--archs {spec}: {target} cannot be loaded as a Python module.")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # a plugin's own bug: one line, not its traceback
            del sys.modules[name]
            raise ArchError(f"--archs {spec}: importing {target} failed: {type(e).__name__}: {e}") from None
        return module
    try:
        return importlib.import_module(target)
    except Exception as e:
        raise ArchError(f"--archs {spec}: cannot import module {target}: {type(e).__name__}: {e}") from None


def plugin_class(spec: str, resolve: Callable[[str], Path] = Path) -> type:
    """The class `spec` names, its module imported (`resolve`: how a relative file path is found)."""
    target, _, cls_name = spec.rpartition(":")
    if not target or not cls_name.isidentifier():
        raise ArchError(f"--archs {spec}: a plugin is path/to/file.py:ClassName or package.module:ClassName.")
    module = _module(target, resolve, spec)
    cls = getattr(module, cls_name, None)
    if not inspect.isclass(cls):
        what = "no class" if cls is None else f"{cls_name} is a {type(cls).__name__}, not a class; no class"
        raise ArchError(f"--archs {spec}: {target} has {what} named {cls_name}.")
    return cls


def make_plugin(cls: type, spec: str) -> Architecture:
    """An architecture of the plugin class `cls` (of `spec`), made without arguments and checked."""
    try:
        arch = cls()
    except Exception as e:
        raise ArchError(f"--archs {spec}: {spec.rpartition(':')[2]}() failed (a plugin is made without arguments): "
                        f"{type(e).__name__}: {e}") from None
    check_protocol(arch, spec)
    return typing.cast(Architecture, arch)


def check_protocol(arch: Any, spec: str) -> None:
    name = getattr(arch, "name", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ArchError(f"--archs {spec}: the class needs a `name` (a short string such as \"mine\", the key of its "
                        f"results), not {name!r}.")
    method = getattr(arch, "retrieve", None)
    if method is None or not callable(method):
        raise ArchError(f"--archs {spec}: the class has no method retrieve; define "
                        "`async def retrieve(self, ctx: Context) -> Discovery`.")
    if not inspect.iscoroutinefunction(method):
        raise ArchError(f"--archs {spec}: retrieve must be `async def retrieve(self, ctx)` (it is not a coroutine "
                        "function).")
    try:
        inspect.signature(method).bind(object())
    except TypeError:
        raise ArchError(f"--archs {spec}: retrieve must take one argument, the Context "
                        f"(its signature is {inspect.signature(method)}).") from None
    try:
        hints = typing.get_type_hints(method)
    except Exception:  # an annotation that does not resolve says nothing either way
        hints = {}
    ret = hints.get("return")
    if ret is not None and ret is not Discovery:
        raise ArchError(f"--archs {spec}: retrieve is annotated to return {getattr(ret, '__name__', ret)}; it must "
                        "return evaluator.study.archs.Discovery.")


def check_discovery(value: Any, registry: Container[str], archs: Container[str], own: str) -> Discovery:
    """What an architecture's retrieve returned, checked and normalised (ids a list of str, scores a list of
    finite floats): `ArchFailure("contract", why)` naming the first breach. `registry`: the ids an id must be
    one of; `archs`: the names a `side` may take (never `own`)."""
    if not isinstance(value, Discovery):
        raise _breach(f"retrieve returned {type(value).__name__}, not evaluator.study.archs.Discovery")
    ids, scores = value.ids, value.scores
    if not isinstance(ids, list | tuple):
        raise _breach(f"Discovery.ids is {type(ids).__name__}, not a list of registry ids")
    if not all(type(x) is str and x in registry for x in ids):  # the common case in one pass; the breach named below
        for i, x in enumerate(ids):
            if not isinstance(x, str):
                raise _breach(f"Discovery.ids[{i}] is {shown(x)}, not a registry id (a str such as \"Tool::api\")")
            if x not in registry:
                raise _breach(f"Discovery.ids[{i}] {shown(x)} is not in the registry (ids are \"{{tool}}::{{api}}\", "
                              "ctx.registry.ids)")
    if scores is None:  # omitted: 1 / rank
        floats = [1.0 / (i + 1) for i in range(len(ids))]
    else:
        if not isinstance(scores, list | tuple):
            raise _breach(f"Discovery.scores is {type(scores).__name__}, not a list of numbers (or None)")
        if len(scores) != len(ids):
            raise _breach(f"Discovery has {len(ids)} ids and {len(scores)} scores: one score per id (or scores=None)")
        floats = scores if type(scores) is list and all(type(v) is float for v in scores) else []
        if not floats:
            for i, v in enumerate(scores):
                if isinstance(v, bool) or not isinstance(v, numbers.Real):
                    raise _breach(f"Discovery.scores[{i}] is {shown(v)}, not a number")
                floats.append(float(v))
        for i, f in enumerate(floats):
            if not math.isfinite(f):
                raise _breach(f"Discovery.scores[{i}] is {f}, not a finite number")
            if i and f > floats[i - 1]:
                raise _breach(f"Discovery.scores rise down the list ({floats[i - 1]:g} at rank {i}, {f:g} at rank "
                              f"{i + 1}): higher is better and the list is best first")
    if not ids and value.plan and value.side is None:
        raise _breach("retrieve returned no ids: a planner cannot be asked with nothing; return "
                      "Discovery([], plan=False) when nothing was found (the query then retrieves nothing)")
    trace = value.trace
    if trace is not None:
        if not isinstance(trace, dict):
            raise _breach(f"Discovery.trace is {type(trace).__name__}, not a dict (a JSON object) or None")
        try:
            text = json.dumps(trace, allow_nan=False, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise _breach(f"Discovery.trace is not JSON ({e})") from None
        if len(text.encode()) > TRACE_MAX_BYTES:
            raise _breach(f"Discovery.trace is {len(text.encode()):,} bytes as JSON, above {TRACE_MAX_BYTES:,}")
        if (clean := scrub(text)) != text:  # a plugin's trace quoting a key: the records never hold it
            trace = json.loads(clean)
        elif not _plain(trace):
            trace = json.loads(text)  # as it will read back: tuples as lists, keys as strings
    for what, calls in (("calls", value.calls), ("reused", value.reused)):
        if not isinstance(calls, dict) or not all(isinstance(n, str) and isinstance(r, ChatResult)
                                                  for n, r in calls.items()):
            raise _breach(f"Discovery.{what} must map a call's name to the ChatResult ctx.chat returned")
    if "planner" in value.calls:
        raise _breach("Discovery.calls names a call \"planner\": that name is the runner's planner call's")
    if value.block is not None and not isinstance(value.block, ArchBlock):
        raise _breach(f"Discovery.block is {type(value.block).__name__}, not a results.schema.ArchBlock")
    if value.side is not None and (not isinstance(value.side, str) or value.side == own or value.side not in archs):
        raise _breach(f"Discovery.side {shown(value.side)} names no other architecture of this run")
    if type(ids) is list and floats is scores and trace is value.trace and value.plan is True:
        return value  # already in the checked form (every built-in's)
    return dataclasses.replace(value, ids=list(ids), scores=floats, trace=trace, plan=bool(value.plan))


def _plain(value: Any) -> bool:
    """A JSON value that reads back as itself (no tuple, no key of another type than str)."""
    if isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


def _breach(why: str) -> ArchFailure:
    return ArchFailure("contract", why)


def shown(x: Any) -> str:
    """A value in an error line: its repr, cut."""
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."
