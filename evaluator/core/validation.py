"""One line from a pydantic error: settings and model profiles are checked field by field with strict
types, and a wrong value becomes one `ConfigError` naming where, the key as the user wrote it, the value
and what it must be (`check_values`, `checked`)."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from evaluator.core.errors import ConfigError

T = TypeVar("T")

_WANT = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table"}
_GOT = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", dict: "a table", list: "a list"}
_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}
# pydantic error types that mean "right type, impossible value"
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error", "too_short",
                 "too_long", "finite_number"}


def toml_label(key: str) -> str:
    """A key as a TOML file spells it (`k =`), for the messages of `checked` on a file's values."""
    return f"{key} ="


def _want(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return _want(get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_want(a) for a in get_args(tp) if a is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    if origin in (list, set, tuple):
        item = get_args(tp)[0]
        item = get_args(item)[0] if get_origin(item) is Annotated else item
        return f"a list of {_PLURAL.get(item) or _want(item)}"
    return _WANT.get(origin or tp, getattr(tp, "__name__", str(tp)))


def _bounds(info: FieldInfo) -> dict[str, Any]:
    """Every declared bound of a field, on it or on its list items: ge, gt, le, lt."""
    metas = list(info.metadata)
    for arg in get_args(info.annotation):
        for inner in get_args(arg)[1:] if get_origin(arg) is Annotated else ():
            metas += inner.metadata if isinstance(inner, FieldInfo) else [inner]
    return {a: getattr(m, a) for m in metas for a in ("ge", "gt", "le", "lt") if getattr(m, a, None) is not None}


def _need(info: FieldInfo, err: Mapping[str, Any]) -> str:
    b = _bounds(info)
    if err["type"] == "literal_error":
        return _choices(info.annotation)
    if err["type"] == "too_short":
        return "non-empty"
    if err["type"] == "too_long":
        return f"at most {(err.get('ctx') or {}).get('max_length', '?')} values long"
    if err["type"] == "finite_number":
        return "a finite number"
    if ("ge" in b or "gt" in b) and ("le" in b or "lt" in b):
        return f"between {b.get('ge', b.get('gt'))} and {b.get('le', b.get('lt'))}"
    if not b:
        return "valid"
    op, v = next(iter(b.items()))
    return f"{ {'ge': '>=', 'gt': '>', 'le': '<=', 'lt': '<'}[op]} {v}"


def _choices(tp: Any) -> str:
    for a in [tp, *get_args(tp)]:
        if get_origin(a) is Literal:
            return "one of " + ", ".join(map(str, get_args(a)))
    return _want(tp)


def config_error(e: ValidationError, info: FieldInfo, key: str, value: Any, where: str,
                 label: Callable[[str], str]) -> ConfigError:
    """One line naming where (`where`: the file, or "command line: "), the key (`label`: as the user
    wrote it, `k =` in a file, `--k` on the command line), the value, and what it must be."""
    err = e.errors(include_url=False)[0]
    item = any(isinstance(x, int) for x in err["loc"])
    shown = f'"{value}"' if isinstance(value, str) else repr(value)
    if err["type"] in _RANGE_ERRORS and (err["type"] != "literal_error" or isinstance(err["input"], str)):
        need = _need(info, err)
        if type(None) in get_args(info.annotation):
            need += " (omit it for none)"
        return ConfigError(f"{where}{label(key)} {shown} is impossible; {'every value' if item else 'it'} must be {need}")
    if err["type"] == "value_error":  # a field's own check (an AfterValidator) says what the value must be
        why = str((err.get("ctx") or {}).get("error") or err["msg"])
        return ConfigError(f"{where}{label(key)} value {err['input']!r} is impossible; it {why}")
    bad = err["input"]
    got = _GOT.get(type(bad), type(bad).__name__)
    return ConfigError(f"{where}{label(key)} {shown} {'holds' if item else 'is'} {got}; expected {_want(info.annotation)}")


@cache
def _field_adapter(cls: type, key: str) -> TypeAdapter[Any]:
    # `cls` is a pydantic dataclass; `type` does not declare the fields pydantic gives it
    info: FieldInfo = cls.__pydantic_fields__[key]  # type: ignore[attr-defined]
    tp: Any = info.annotation
    assert tp is not None  # every field of a pydantic dataclass is annotated
    if get_origin(tp) is tuple and get_args(tp)[1:] == (...,):  # a frozen list: TOML and argparse give lists
        tp = list.__class_getitem__(get_args(tp)[0])
    form: Any = Annotated[(tp, *info.metadata)] if info.metadata else tp  # built at run time
    return TypeAdapter(form)


def check_values(cls: type, values: Mapping[str, Any], where: str, label: Callable[[str], str]) -> None:
    """Each value against the type and range `cls` declares for it, with strict types (TOML's and
    argparse's values are typed already: a string is no number, true is no integer); else one
    `ConfigError` line."""
    for key, value in values.items():
        try:
            _field_adapter(cls, key).validate_python(value, strict=True)
        except ValidationError as e:
            raise config_error(e, cls.__pydantic_fields__[key], key, value, where, label) from None  # type: ignore[attr-defined]  # as above


def checked(cls: type[T], values: Mapping[str, Any], where: str, label: Callable[[str], str]) -> T:
    """`cls(**values)` once `check_values` passed, or one `ConfigError` line."""
    check_values(cls, values, where, label)
    try:
        return cls(**values)
    except ValidationError as e:  # a required value is missing
        raise ConfigError(f"{where}{e.errors(include_url=False)[0]['loc'][0]} is required") from None
