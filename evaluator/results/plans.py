"""The parsed answers a record keeps (`PtrBlock.stubs`, `PlanBlock.parse_audit`), and the one text a stub is
embedded as. `study.parse` produces them; the record format (`results.schema`) and the analyses read them.
"""

from __future__ import annotations

from dataclasses import field

import pydantic.dataclasses


@pydantic.dataclasses.dataclass
class Stub:
    """One stub of a discovery reply, as parsed and as `queries.jsonl` keeps it (`PtrBlock.stubs`)."""

    name: str
    reasoning: str
    # Which rule produced it: "<where>[/repaired|/truncated]:<container>:<item form>".
    rule: str = field(default="", compare=False)
    # A copy of the prompt's own example rather than the model's need; left out of Match%.
    example_copy: bool = False


@pydantic.dataclasses.dataclass
class ParseAudit:
    """The provenance of every parsed field of a plan, as `queries.jsonl` keeps it (`PlanBlock.parse_audit`)."""

    source: str = ""  # where the answer object came from: "<where>[/repaired|/truncated]"
    steps_rule: str = ""
    selected_rule: str = ""
    names: list[tuple[str, str, str, bool]] = field(default_factory=list)  # per name: raw, api, rule, offered


def stub_text(stub: Stub) -> str:
    """The text embedded for a stub's retrieval (STUDY.md)."""
    return f"{stub.name}: {stub.reasoning}"
