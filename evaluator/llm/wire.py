"""The request as this host takes it: the fields it rejected, and the schema form it accepts.

A host that rejects a request field (a 400 or 422 naming `seed`, `response_format`, ...) gets it dropped
for every later attempt of the model, calls already queued or in flight included; one that rejects
`{"type": "json_schema", ...}` gets each schema as `{"type": "json_object", "schema": ...}`. Both are told
once, with the host's reason. Cache keys stay those of the logical request (cache.py): `wire` only shapes
what is sent.
"""

from __future__ import annotations

import logging
from typing import Any

from evaluator.core.redact import redact
from evaluator.llm.accounting import ModelStats

log = logging.getLogger("evaluator.llm")


def is_json_schema(rf: Any) -> bool:
    """`response_format` in OpenAI's json_schema form."""
    return isinstance(rf, dict) and rf.get("type") == "json_schema" and isinstance(rf.get("json_schema"), dict)


def _as_json_object(rf: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_object", "schema": rf["json_schema"].get("schema", {})}


class WireShape:
    """What one model's host rejected so far (`name`: the model; `secret`: redacted from its reasons)."""

    def __init__(self, name: str, stats: ModelStats, secret: str | None) -> None:
        self._name = name
        self._stats = stats
        self._secret = secret
        self.dropped: set[str] = set()  # fields this host rejected; never sent again
        self.schema_as_object = False  # json_schema rejected: send the schema in json_object form

    def wire(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` without the fields this host rejected (and with a schema it can take)."""
        if self.schema_as_object and is_json_schema(body.get("response_format")):
            body = {**body, "response_format": _as_json_object(body["response_format"])}
        if not self.dropped:
            return body
        return {k: v for k, v in body.items() if k not in self.dropped}

    def dropped_from(self, body: dict[str, Any]) -> list[str]:
        """The fields of `body` left out of what is sent (kept with a stored reply)."""
        return sorted(self.dropped & set(body))

    def downgrade(self, reason: str) -> None:
        """The host rejects `{"type": "json_schema", ...}`: send `{"type": "json_object", "schema": ...}`.

        That is the form llama-cpp-python (and Together, Anyscale) constrain output with; a host that
        rejects that too gets free text (`drop`). The cache key stays that of the requested schema.
        """
        if self.schema_as_object:
            return
        self.schema_as_object = True
        self._stats.dropped_params.append("response_format:json_schema")
        log.warning(
            "%s: the endpoint rejects response_format json_schema; sending each schema as "
            '{"type": "json_object", "schema": ...} instead (llama-cpp-python\'s form) [%s]',
            self._name, redact(reason, self._secret)[:200],
        )

    def drop(self, names: frozenset[str], reason: str) -> None:
        new = sorted(names - self.dropped)
        if not new:
            return  # already dropped by another call: this one was in flight with it
        self.dropped.update(new)
        self._stats.dropped_params.extend(new)
        what = ", ".join(f"`{n}`" for n in new)
        extra = " (structured output off: free text for this model)" if "response_format" in new else ""
        log.warning(
            "%s: the endpoint rejects %s; sending every request of this model without it from now on%s [%s]",
            self._name, what, extra, redact(reason, self._secret)[:200],
        )
