"""Discovery architectures as pluggable classes: the contract (`base`), the built-ins (one module each) and user plugins.

`resolve(specs, ...)` turns `--archs` into a `Lineup`, once, before any work: the architectures by name, in order,
each a built-in's name or a plugin's `file.py:Class` / `module:Class` (`plugins`: imported and checked then). The
architectures are made from it once route's τ is known (`Lineup.make`, after RtP has run). The built-ins (rtp and
ptr, the paper's; hyde, rewrite, fusion, route) are named once, by the setting's choices
(`settings.sections.ARCHS`, which checks `--archs`); `BUILTIN` is that list, and each is made from the class whose
`name` it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from evaluator.study.archs.plugins import check_discovery, is_plugin_spec, make_plugin, plugin_class, shown
from evaluator.study.archs.ptr import PtR
from evaluator.study.archs.rewrite import Rewrite
from evaluator.study.archs.route import Route, default_tau, route_side
from evaluator.study.archs.rtp import RtP
from evaluator.study.parse import parse_json

__all__ = ["Architecture", "ArchError", "ArchFailure", "Context", "Discovery", "Hits", "RegistryView", "Searched",
           "DEFERRED_KIND", "TRACE_MAX_BYTES", "BUILTIN", "Lineup", "resolve", "check_discovery", "shown", "default_tau",
           "route_side", "parse_json"]

BUILTIN = ARCHS  # the one list of the built-ins' names
Maker = Callable[[float], Architecture]  # an architecture made with route's τ (only route reads it)
# Each built-in made from its class, by the class's `name` (one of BUILTIN); route is made with its τ.
_MAKERS: dict[str, Maker] = {
    RtP.name: lambda _tau: RtP(), PtR.name: lambda _tau: PtR(), HyDE.name: lambda _tau: HyDE(),
    Rewrite.name: lambda _tau: Rewrite(), Fusion.name: lambda _tau: Fusion(), Route.name: Route}


def builtin(name: str, tau: float) -> Architecture:
    """The built-in architecture `name` (one of `BUILTIN`)."""
    return _MAKERS[name](tau)


@dataclass(frozen=True)
class Lineup:
    """`--archs` resolved: each architecture's name -> its spec as given, in `--archs` order, and how it is made
    (a built-in from its class; a plugin from the class its spec names, imported and checked once). route's τ
    is known only once RtP has run, so the architectures are made then (`make`)."""

    specs: dict[str, str]
    makers: dict[str, Maker] = field(repr=False)

    def make(self, tau: float) -> dict[str, tuple[str, Architecture]]:
        """name -> (spec, architecture), in `--archs` order, route with `tau`. Each call makes new ones: each
        runner (the probe, a collect pass, the study) has its own, so a plugin's state never crosses between
        them."""
        return {name: (self.specs[name], make(tau)) for name, make in self.makers.items()}


def resolve(specs: Sequence[str], resolve_path: Callable[[str], Path] = Path) -> Lineup:
    """`--archs` as a `Lineup`: every plugin imported, made once and checked; an unknown name, or two
    architectures of one name, is one `ArchError` line."""
    names: dict[str, str] = {}
    makers: dict[str, Maker] = {}
    for spec in specs:
        if is_plugin_spec(spec):
            cls = plugin_class(spec, resolve_path)
            name = make_plugin(cls, spec).name  # made once now: a class that cannot be is one line before any work
            maker: Maker = _plugin_maker(cls, spec)
        elif spec in BUILTIN:
            name, maker = spec, _MAKERS[spec]
        else:
            raise ArchError(f"--archs {spec}: no such architecture; built-in: {', '.join(BUILTIN)}, or a plugin "
                            "path/to/file.py:ClassName or package.module:ClassName.")
        if name in names:
            raise ArchError(f"--archs {spec}: a second architecture named {name!r} (from {names[name]}); "
                            "give the plugin another `name`.")
        if is_plugin_spec(spec) and name in BUILTIN:
            raise ArchError(f"--archs {spec}: its name {name!r} is a built-in architecture's; give it another.")
        names[name], makers[name] = spec, maker
    return Lineup(names, makers)


def _plugin_maker(cls: type, spec: str) -> Maker:
    return lambda _tau: make_plugin(cls, spec)
