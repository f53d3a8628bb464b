"""Parameters of a tool definition: the (name, description) pairs that EMBED_TEXT_RULE embeds."""

from __future__ import annotations

from typing import Any

from evaluator.core.errors import DataError
from evaluator.data.model import Param
from evaluator.data.source import json_type


def schema_params(schema: Any, where: str, field: str) -> tuple[Param, ...]:
    """Top-level properties of a JSON Schema object, in declared order.

    A missing or null schema has no parameters; a property whose schema is not an object (JSON Schema
    allows `true`) is kept by name alone.
    """
    if schema is None:
        return ()
    if not isinstance(schema, dict):
        raise DataError(f"{where}: '{field}' must be a JSON Schema object, not {json_type(schema)}.")
    props = schema.get("properties")
    if props is None:
        return ()
    if not isinstance(props, dict):
        raise DataError(f"{where}: '{field}.properties' must be an object mapping names to schemas, not {json_type(props)}.")
    out: list[Param] = []
    for name, prop in props.items():
        desc = prop.get("description") if isinstance(prop, dict) else None
        out.append((name, desc.strip() if isinstance(desc, str) and desc.strip() else None))
    return tuple(out)
