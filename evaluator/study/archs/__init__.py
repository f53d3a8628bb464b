"""Discovery architectures as pluggable classes: the contract (`base`), the built-ins (one module each) and user plugins.

`resolve(specs, ...)` turns `--archs` into architectures by name, in order: a built-in's name, or a plugin's
`file.py:Class` / `module:Class` (`plugins`). The built-ins (rtp and ptr, the paper's; hyde, rewrite, fusion,
route) are named once, by the setting's choices (`settings.sections.ARCHS`, which checks `--archs`); `BUILTIN` is
that list, and each is made from the class whose `name` it is.
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

BUILTIN = ARCHS  # the one list of the built-ins' names
# Each built-in made from its class, by the class's `name` (one of BUILTIN); route is made with its τ.
_MAKERS: dict[str, Callable[[float], Architecture]] = {
    RtP.name: lambda _tau: RtP(), PtR.name: lambda _tau: PtR(), HyDE.name: lambda _tau: HyDE(),
    Rewrite.name: lambda _tau: Rewrite(), Fusion.name: lambda _tau: Fusion(), Route.name: Route}


def builtin(name: str, tau: float) -> Architecture:
    """The built-in architecture `name` (one of `BUILTIN`)."""
    return _MAKERS[name](tau)


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
