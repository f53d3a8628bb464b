"""Records beyond memory: a study's records spilled to disk as they finish (`RecordSpill`) and an output
folder's queries.jsonl passed over again and again without being held (`SavedRecords`).

A record in memory is several times its line in queries.jsonl, and a study of 100,000 queries x 4 runs x 2
models held as records would not fit in memory (the sizes: bench/README.md, "results/stream.py"). Up to
`held()` records (8,000) stay in memory as a list, as before: the paper's study (500 queries x 4 runs x 2
models, 4,000 records) passes over them many times, and parsing every line again at each pass is what holding
them saves. Beyond it, what is held per record is its sort key and where its line is, and every analysis reads
the records as a stream, one at a time.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, overload

import orjson

from evaluator.data import qid_key
from evaluator.results import migrate
from evaluator.results.schema import (
    FORMAT_VERSION,
    QUERIES_FILE,
    OutputDir,
    Record,
    RecordKey,
    record_key,
    record_line,
)

HELD = 8_000
HELD_ENV = "EVALUATOR_RECORDS_HELD"  # another limit (0: always stream); tests and bench/scale.py set it


def held() -> int:
    """How many records a study or a report keeps in memory before it streams them."""
    raw = os.environ.get(HELD_ENV, "")
    return int(raw) if raw.strip().isdigit() else HELD


def _key_of(line: bytes, version: int) -> RecordKey:
    """record_key of one line without building the record (orjson: ~5x quicker than the typed parse)."""
    d: Mapping[str, Any] = orjson.loads(line)
    if version != FORMAT_VERSION:
        d = migrate.record(dict(d), version)
    qid = d["query_id"]
    if not isinstance(qid, int | str):
        raise TypeError("query_id")
    return RecordKey(d.get("model") or "", int(d.get("run") or 0), str(d["subset"]), qid_key(qid))


class SavedRecords(Sequence[Record]):
    """An output folder's records in `record_key` order, read from queries.jsonl at each pass: held are the
    offset and line number of each (16 bytes) and, for a file not written in key order, that order."""

    def __init__(self, od: OutputDir) -> None:
        self.od = od.require()
        self.path = od.path / QUERIES_FILE
        self.version = od.saved_version()
        self._offsets = array("q")
        self._lines = array("q")
        last: RecordKey | None = None
        in_order = True
        with open(self.path, "rb") as fh:
            pos = 0
            for n, line in enumerate(fh, 1):
                if line.strip():
                    if in_order:  # written by write_records, the file is in key order: checked line by line
                        try:
                            key = _key_of(line, self.version)
                        except (ValueError, TypeError, KeyError, migrate.FormatError):
                            od.parse_record(line, n, self.version)  # the one-line message of a line that is no record
                            raise
                        in_order = last is None or last <= key
                        last = key
                    self._offsets.append(pos)
                    self._lines.append(n)
                pos += len(line)
        self._order: array[int] | None = None
        if not in_order:  # a file sorted some other way (written by hand): its key order, found in one more pass
            with open(self.path, "rb") as fh:
                keys = [_key_of(line, self.version) for line in fh if line.strip()]
            self._order = array("q", sorted(range(len(keys)), key=keys.__getitem__))

    def _read(self, i: int, fh: BinaryIO | None = None) -> tuple[bytes, int]:
        if fh is None:
            with open(self.path, "rb") as f:
                f.seek(self._offsets[i])
                return f.readline(), self._lines[i]
        fh.seek(self._offsets[i])
        return fh.readline(), self._lines[i]

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> list[Record]: ...
    def __getitem__(self, i: int | slice) -> Record | list[Record]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        j = self._order[i] if self._order is not None else i
        line, n = self._read(j)
        return self.od.parse_record(line, n, self.version)

    def take(self, positions: Iterable[int]) -> list[Record]:
        """The records at these positions (of the key order), read through one open file."""
        with open(self.path, "rb") as fh:
            out = []
            for i in positions:
                line, n = self._read(self._order[i] if self._order is not None else i, fh)
                out.append(self.od.parse_record(line, n, self.version))
            return out

    def __iter__(self) -> Iterator[Record]:
        with open(self.path, "rb") as fh:
            if self._order is None:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        yield self.od.parse_record(line, n, self.version)
                return
            for j in self._order:
                line, n = self._read(j, fh)
                yield self.od.parse_record(line, n, self.version)


def records_of(od: OutputDir) -> Sequence[Record]:
    """An output folder's records in `record_key` order: a list up to `held()` of them, else a stream."""
    od.require()
    with open(od.path / QUERIES_FILE, "rb") as fh:
        count = sum(1 for line in fh if line.strip())
    if count > held():
        return SavedRecords(od)
    return sorted(od.read_records(), key=record_key)


def in_key_order(records: Iterable[Record]) -> Sequence[Record]:
    """`records` in record_key order: a stream over the file is already; a list is sorted (a copy)."""
    return records if isinstance(records, SavedRecords) else sorted(records, key=record_key)


class RecordSpill:
    """The study runner's sink: records held as they finish, up to `held`; past it, each finished record is one
    line of a spill file in the output folder, and only its key and place are kept. `finish` writes
    queries.jsonl in `record_key` order (the spill's lines copied in that order) and returns the records."""

    SPILL = ".queries.spill"

    def __init__(self, od: OutputDir, limit: int | None = None) -> None:
        self.od = od
        self.limit = held() if limit is None else limit
        self.records: list[Record] = []
        self._fh: BinaryIO | None = None
        self._index: list[tuple[RecordKey, int, int]] = []  # (key, offset, length) of each spilled line
        self._pos = 0

    @property
    def spill_path(self) -> Path:
        return self.od.path / self.SPILL

    def __len__(self) -> int:
        return len(self.records) + len(self._index)

    def append(self, rec: Record) -> None:
        if self._fh is None:
            if len(self.records) < self.limit:
                self.records.append(rec)
                return
            self.od.path.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.spill_path, "wb")  # noqa: SIM115 (open until finish)
            held_now, self.records = self.records, []
            for r in held_now:
                self._spill(r)
        self._spill(rec)

    def _spill(self, rec: Record) -> None:
        assert self._fh is not None
        line = record_line(rec).encode()
        self._fh.write(line)
        self._index.append((record_key(rec), self._pos, len(line)))
        self._pos += len(line)

    def finish(self) -> Sequence[Record]:
        if self._fh is None:
            self.od.write_records(self.records)
            return sorted(self.records, key=record_key)
        self._fh.close()
        self._fh = None
        self._index.sort()
        index = self._index

        def copy(out: BinaryIO) -> None:
            with open(self.spill_path, "rb") as src:
                for _key, offset, length in index:
                    src.seek(offset)
                    out.write(src.read(length))

        self.od.write_records_with(copy)
        self.spill_path.unlink(missing_ok=True)
        self._index = []
        return SavedRecords(self.od)

    def discard(self) -> None:
        """A study that stopped: its spill file goes (the response cache keeps every reply for the rerun)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self.spill_path.unlink(missing_ok=True)
