"""A user's architecture from `--archs`: `path/to/file.py:ClassName` or `package.module:ClassName`.

Loaded and checked before any paid work: a file or module that does not import, a class that is not there,
cannot be made without arguments, has no `name` or no `async def retrieve(self, ctx)`, or annotates another
return type than `Discovery` is one `ArchError` line naming the flag and the spec (exit 2, no traceback).
What it returns is checked on every call (`check_discovery`), and first on one probe query before the LLM
stage (`study.runner.probe_archs`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from evaluator.study.archs.base import ArchError, Architecture, Discovery

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


def load_plugin(spec: str, resolve: Callable[[str], Path] = Path) -> Architecture:
    """The architecture `spec` names, made and checked (`resolve`: how a relative file path is found)."""
    target, _, cls_name = spec.rpartition(":")
    if not target or not cls_name.isidentifier():
        raise ArchError(f"--archs {spec}: a plugin is path/to/file.py:ClassName or package.module:ClassName.")
    module = _module(target, resolve, spec)
    cls = getattr(module, cls_name, None)
    if not inspect.isclass(cls):
        what = "no class" if cls is None else f"{cls_name} is a {type(cls).__name__}, not a class; no class"
        raise ArchError(f"--archs {spec}: {target} has {what} named {cls_name}.")
    try:
        arch = cls()
    except Exception as e:
        raise ArchError(f"--archs {spec}: {cls_name}() failed (a plugin is made without arguments): "
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


def check_discovery(value: Any, spec: str) -> Discovery:
    """What a plugin's retrieve returned, checked: one line when it is not a `Discovery` of ids and scores."""
    if not isinstance(value, Discovery):
        raise ArchError(f"--archs {spec}: retrieve returned {type(value).__name__}, not "
                        "evaluator.study.archs.Discovery.")
    if len(value.ids) != len(value.scores) or not all(isinstance(i, str) for i in value.ids):
        raise ArchError(f"--archs {spec}: retrieve's Discovery needs one score per id and ids as strings "
                        f"({len(value.ids)} ids, {len(value.scores)} scores).")
    return value
