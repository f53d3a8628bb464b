"""Discovery architectures as units: the contract (`base`), the built-ins (one module each) and user plugins.

`resolve(specs, ...)` turns `--archs` into architectures by name, in order: a built-in's name, or a plugin's
`file.py:Class` / `module:Class` (`plugins`). Built-ins: rtp, ptr (the paper's), hyde, rewrite, fusion, route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from evaluator.settings.sections import ARCHS
from evaluator.study.archs.base import (
    DEFERRED_KIND,
    TRACE_MAX_BYTES,
    ArchError,
    ArchFailure,
    Architecture,
    Context,
    Discovery,
    Hits,
    RegistryView,
    Searched,
)
from evaluator.study.archs.fusion import Fusion
from evaluator.study.archs.hyde import HyDE
from evaluator.study.archs.plugins import check_discovery, is_plugin_spec, load_plugin, shown
from evaluator.study.archs.ptr import PtR
from evaluator.study.archs.rewrite import Rewrite
from evaluator.study.archs.route import Route, default_tau, route_side
from evaluator.study.archs.rtp import RtP
from evaluator.study.parse import parse_json

__all__ = ["Architecture", "ArchError", "ArchFailure", "Context", "Discovery", "Hits", "RegistryView", "Searched",
           "DEFERRED_KIND", "TRACE_MAX_BYTES", "BUILTIN", "resolve", "check_discovery", "shown", "default_tau",
           "route_side", "parse_json"]

BUILTIN = ARCHS  # the setting's choices (settings.load): one list


def builtin(name: str, tau: float) -> Architecture:
    made: dict[str, Callable[[], Architecture]] = {
        "rtp": RtP, "ptr": PtR, "hyde": HyDE, "rewrite": Rewrite, "fusion": Fusion, "route": lambda: Route(tau)}
    return made[name]()


def resolve(specs: Sequence[str], tau: float = 0.0, resolve_path: Callable[[str], Path] = Path,
            ) -> dict[str, tuple[str, Architecture]]:
    """name -> (spec, architecture), in `--archs` order; two architectures of one name are one line."""
    out: dict[str, tuple[str, Architecture]] = {}
    for spec in specs:
        arch = load_plugin(spec, resolve_path) if is_plugin_spec(spec) else builtin(spec, tau) \
            if spec in BUILTIN else None
        if arch is None:
            raise ArchError(f"--archs {spec}: no such architecture; built-in: {', '.join(BUILTIN)}, or a plugin "
                            "path/to/file.py:ClassName or package.module:ClassName.")
        if arch.name in out:
            raise ArchError(f"--archs {spec}: a second architecture named {arch.name!r} (from {out[arch.name][0]}); "
                            "give the plugin another `name`.")
        if is_plugin_spec(spec) and arch.name in BUILTIN:
            raise ArchError(f"--archs {spec}: its name {arch.name!r} is a built-in architecture's; give it another.")
        out[arch.name] = (spec, arch)
    return out
