"""Reading input files: the one place where decode, parse and type errors become located `DataError`s.

Every reader goes through `read_text` (bytes -> text: gzip, UTF-8), one of `parse_json`,
`parse_jsonl`, `parse_csv` (text -> records, each with a `where` such as `file:12`), and converts
records inside `located(where, expected)`, so any KeyError/TypeError/ValueError raised while reading a
record ends as one line naming the file, the line or record, and what was expected. `reading(path)`
wraps a whole file for what is left (permissions, a folder where a file should be, nesting too deep).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, overload

import orjson

from evaluator.core.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
# Errors a reader may raise on a record of the wrong shape; `located` turns them into DataError.
RECORD_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def one_line(text: object, limit: int = 200) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def stem(path: Path) -> str:
    """The file name without .gz and its format suffix: `servers/git.json.gz` -> `git`."""
    name = path.name
    for suffix in (".gz", ".jsonl", ".ndjson", ".json", ".csv", ".tsv"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name or path.name


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Whatever goes wrong while reading `path` ends as one DataError line naming it."""
    try:
        yield
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"{path}: no such file or folder; check the path.") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder where a file was expected.") from None
    except PermissionError:
        raise DataError(f"{path}: permission denied; make the file readable.") from None
    except RecursionError:
        raise DataError(f"{path}: nested too deeply to read; expected plain records.") from None
    except (OSError, *RECORD_ERRORS, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {one_line(e)}).") from None


@contextmanager
def located(where: str, expected: str) -> Iterator[None]:
    """Errors from converting one record end as `where: expected ... (what was wrong)`."""
    try:
        yield
    except DataError:
        raise
    except RECORD_ERRORS as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else one_line(e)
        raise DataError(f"{where}: expected {expected} ({detail}).") from None


def read_text(path: Path) -> str:
    """The file's text: gunzipped when it is gzip, decoded as UTF-8 (a leading BOM is dropped)."""
    with reading(path):
        raw = path.read_bytes()
    gz = raw[:2] == GZIP_MAGIC
    if path.suffix == ".gz" and not gz:
        raise DataError(f"{path}: not a gzip file although it ends in .gz; decompress it properly or rename it.")
    if gz:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(
                f"{path}: damaged gzip file ({one_line(e) or type(e).__name__}); re-download or re-compress it."
            ) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        of = " of the decompressed text" if gz else ""
        raise DataError(
            f"{path}: not valid UTF-8 at byte {e.start}{of} (line {line}); save the file as UTF-8."
        ) from None


def parse_json(path: Path, text: str, expected: str) -> Any:
    if not text.strip():
        raise DataError(f"{path}: the file is empty; expected {expected}.")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno}); expected {expected}.") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to read; expected {expected}.") from None


def parse_jsonl(path: Path, text: str) -> list[tuple[str, dict]]:
    """One JSON object a line (blank lines skipped), each with its `file:line`."""
    out: list[tuple[str, dict]] = []
    # split on "\n" only: JSON strings may hold U+2028 and other characters splitlines() breaks on
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            # orjson reads the 47k-line registry in a third of json's time; a line it refuses (NaN,
            # integers beyond 64 bits, malformed) is read by json, which accepts the first two and
            # words the error for the third.
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            rec = _json_line(line, where)
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a JSON object, got {json_type(rec)}.")
        out.append((where, rec))
    return out


def _json_line(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{where}: malformed JSON ({e.msg} at column {e.colno}); each line must be one JSON object."
        ) from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deeply to read.") from None


def parse_csv(path: Path, text: str, required: tuple[str, ...]) -> list[tuple[str, dict[str, str]]]:
    """Rows of a CSV (or tab/semicolon separated) file as dicts keyed by lower-cased header names.

    The separator is the first of `,`, tab, `;` whose split of the header line names every required
    column; a row with more cells than the header is an error (usually an unquoted separator).
    """
    header_line = next((ln for ln in text.splitlines() if ln.strip()), "")
    delim = next(
        (d for d in (",", "\t", ";") if set(required) <= {c.strip().strip('"').lower() for c in header_line.split(d)}),
        None,
    )
    if delim is None:
        raise DataError(
            f"{path}:1: expected a header row naming the columns {', '.join(required)} "
            f"(comma, tab or semicolon separated); found {one_line(header_line, 120)!r}."
        )
    out: list[tuple[str, dict[str, str]]] = []
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delim)
        header: list[str] | None = None
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not any(c.strip() for c in row):
                continue
            if header is None:
                header = [c.strip().lower() for c in row]
                dup = sorted({h for h in header if h and header.count(h) > 1})
                if dup:
                    raise DataError(f"{where}: column {dup[0]!r} appears twice in the header.")
                continue
            if len(row) > len(header):
                raise DataError(
                    f"{where}: {len(row)} cells but the header has {len(header)}; quote cells that contain {delim!r}."
                )
            out.append((where, {h: (row[i] if i < len(row) else "") for i, h in enumerate(header) if h}))
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: malformed CSV ({one_line(e)}).") from None
    return out


def json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


@overload
def get_str(rec: dict, key: str, where: str, *, required: Literal[True], aliases: tuple[str, ...] = ()) -> str: ...
@overload
def get_str(rec: dict, key: str, where: str, *, required: bool = False, aliases: tuple[str, ...] = ()) -> str | None: ...
def get_str(rec: dict, key: str, where: str, *, required: bool = False, aliases: tuple[str, ...] = ()) -> str | None:
    """A string field (or one of its aliases); null or absent is None unless required."""
    value = rec.get(key)
    if type(value) is str and (not required or value.strip()):
        return value  # the common case, checked first: a registry has ~200k such fields
    for k in (key, *aliases):
        if k in rec and rec[k] is not None:
            value = rec[k]
            if not isinstance(value, str):
                raise DataError(f"{where}: '{k}' must be a string, not {json_type(value)}.")
            if required and not value.strip():
                raise DataError(f"{where}: '{k}' is empty; expected a non-empty string.")
            return value
    if required:
        raise DataError(f"{where}: missing the string field '{key}'.")
    return None
