"""Format versions of the output folder's saved files, and the one place where older shapes are migrated.

Every saved file is read through one function here (`meta`, `record`, `scaling`, `routing`, `summary`)
before pydantic validates it, so a change of a saved shape is one new step in this module and nowhere
else (as inspect_ai migrates its old logs in one `model_validator(mode="before")`). Each function takes
the JSON shape as read and returns the shape of FORMAT_VERSION; the module imports nothing of the package
but its error's base (`core.errors`), so every reader (schema, analysis) may call it.

Versions:
- 0: release 0.1.0 and before (e.g. commits 2acddc3, 9ca467f): no file carries `format_version`. Null
  stood for "the default" in meta.json; `subsets` could be a bare list of names, a model its bare
  name, `ks` unsorted; scaling.json's `meta.timing_s` was a dict of stage seconds; a file without
  `backend` was written before the embedding runtimes existed: by torch.
- 1: meta.json carries `format_version`; scaling.json, routing.json and summary.json carry none.
- 2: scaling.json, routing.json and summary.json carry `format_version` too.
- 3: meta.json's `settings` (and summary.json's `meta.settings`) are nested by section, as the TOML tables
  ([data], [embed], [retrieval], [run], [analysis]), each key named as in the file (`data.dir`, not
  `data_dir`; `embed.model`, not `embedder`); meta.json may carry `fitted` (settings fitted to the data).
- 4: a `queries.jsonl` line holds its architectures as one mapping, `archs: {name: block}` in `--archs` order
  (architectures are plugins: hyde, rewrite, fusion, route, a user's class); before it, `rtp` and `ptr` were
  top-level keys of the line. `record` moves them (`archs_mapping`); their blocks are unchanged.
- 5: a `queries.jsonl` line may carry `grades` (graded relevance, a BEIR folder's qrels scores: `{api id: grade}`);
  meta.json's `settings.data` holds `split` and `subset_field`; a block may carry `failure: {"kind", "error"}` (the
  architecture failed on the query: `arch_error`, `contract`, `timeout`, `cycle`; the block is not scored), and
  every block with `errors` (an own call that failed for good) is left out of the metrics and gets no planner
  call. Nothing to move: a line without `grades` has binary gold (every gold id grade 1), as every line before 5,
  a line of 4 has no `failure`, and a section's missing key is its default. The version says that an evaluator
  of 4, which would score graded gold as binary and a failed block as one that retrieved nothing, must not read
  the folder.

`queries.jsonl` lines carry no version of their own: they are written only together with meta.json, and
the folder's meta.json version applies to them (a field on every line would change every line of the
saved data for no reader's benefit). A file without a version field is version 0; since version 1 left
scaling.json, routing.json and summary.json unversioned too, each step from 0 looks at the shape it
changes, so it leaves a version-1 file as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evaluator.core.errors import OutputError

FORMAT_VERSION = 5

JSON = dict[str, Any]  # a saved file's JSON object, as read: its shape is what this module checks


class FormatError(OutputError):
    """A saved file's `format_version` is not one this evaluator reads. Not a ValueError: raised inside a
    pydantic validator it passes through as itself (the readers add the file's path), not as a
    ValidationError."""


def version_of(d: Mapping[str, Any], file: str) -> int:
    """The format version a saved file was written in; a newer one than this evaluator's is refused."""
    version = d.get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= FORMAT_VERSION:
        raise FormatError(f"{file}: format_version {version!r} is newer than this evaluator's {FORMAT_VERSION}; "
                          "upgrade the evaluator to read it")
    return version


def meta(d: Mapping[str, Any]) -> JSON:
    """`meta.json` of any version -> FORMAT_VERSION."""
    version = version_of(d, "meta.json")
    out = dict(d)
    if version == 0:
        out = {k: v for k, v in out.items() if v is not None}
        if isinstance(out.get("subsets"), list):
            out["subsets"] = {str(s): 0 for s in out["subsets"]}
        out["models"] = [{"name": m} if isinstance(m, str) else m for m in out.get("models") or []]
        if isinstance(out.get("ks"), list):
            out["ks"] = sorted({int(x) for x in out["ks"]})
        if not isinstance(out.get("registry"), Mapping):
            out.pop("registry", None)
        out = _torch_if_unsaid(out)
    # 1 -> 2: meta.json's shape did not change; 3 -> 4 neither (the records' did); 4 -> 5 only by keys with defaults.
    if version < 3 and isinstance(out.get("settings"), Mapping):
        out["settings"] = nested_settings(out["settings"])
    out["format_version"] = FORMAT_VERSION
    return out


# Versions 0-2 kept the settings flat: every flat name -> (table, key) of version 3. Names no longer saved
# (`embed_threads`, per-invocation options) are dropped.
_SECTION_OF = {
    "data_dir": ("data", "dir"), "registry": ("data", "registry"), "subsets": ("data", "subsets"),
    "limit": ("data", "limit"), "tools": ("data", "tools"), "queries": ("data", "queries"),
    "tools_format": ("data", "tools_format"),
    "embedder": ("embed", "model"), "device": ("embed", "device"), "precision": ("embed", "precision"),
    "backend": ("embed", "backend"), "batch_size": ("embed", "batch_size"),
    "k": ("retrieval", "k"), "ks": ("retrieval", "ks"), "fallback_to_query": ("retrieval", "fallback_to_query"),
    "retriever": ("retrieval", "retriever"),
    "models": ("run", "models"), "runs": ("run", "runs"), "archs": ("run", "archs"), "cache_dir": ("run", "cache_dir"),
    "out": ("run", "out"),
    **{name: ("analysis", name) for name in ("routing_train", "routing_test", "routing_folds", "routing_seed",
                                              "scaling_subsets", "scaling_sizes", "scaling_seeds", "divergence_subset")},
}


_SECTIONS = {table for table, _ in _SECTION_OF.values()}


def nested_settings(flat: Mapping[str, Any]) -> JSON:
    """2 -> 3: the flat `settings` of meta.json (or of summary.json's study view) by section. A null stood for
    "the default" in version 0 and is left out, as a name no longer saved."""
    out: JSON = {}
    for name, value in flat.items():
        if name in _SECTIONS and isinstance(value, Mapping):  # nested already (a hand-made file of version 0)
            out.setdefault(name, {}).update(value)
            continue
        where = _SECTION_OF.get(name)
        if where is not None and value is not None:
            out.setdefault(where[0], {})[where[1]] = value
    return out


def record(d: Mapping[str, Any], version: int) -> Mapping[str, Any]:
    """A `queries.jsonl` line of a folder whose meta.json is of `version` -> FORMAT_VERSION (fields added
    since 0.1.0 have defaults that mean "not recorded"); `schema.OutputDir.read_records` sends an older
    folder's lines through it. 3 -> 4: the top-level `rtp` / `ptr` blocks into the `archs` mapping; 4 -> 5: none
    (a line without `grades` is binary gold; no block of 4 carries `failure`)."""
    return archs_mapping(d) if version < 4 else d


_OLD_ARCHS = ("rtp", "ptr")  # the order RtP and PtR were always run and reported in


def archs_mapping(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record line with top-level `rtp` / `ptr` blocks (format < 4) as one with `archs: {rtp, ptr}`; a line
    that has `archs` already is returned as it is. A null block (an architecture that did not run) is dropped."""
    if not any(a in d for a in _OLD_ARCHS):
        return d
    out = {k: v for k, v in d.items() if k not in _OLD_ARCHS}
    # rtp and ptr first, as they were run and reported; a hand-made line's further blocks after them
    archs = {a: d[a] for a in _OLD_ARCHS if d.get(a) is not None}
    archs.update({k: v for k, v in (out.get("archs") or {}).items() if k not in archs})
    ptr = archs.get("ptr")
    if isinstance(ptr, Mapping) and "stubs" not in ptr:  # a PtR block is typed by its stubs (schema.Block)
        archs["ptr"] = {**ptr, "stubs": []}
    out["archs"] = archs
    return out


def _stamped(d: Mapping[str, Any]) -> JSON:
    return {**d, "format_version": FORMAT_VERSION}


def _torch_if_unsaid(meta: JSON) -> JSON:
    """Before the ONNX / OpenVINO runtimes (and the `backend` field), every vector came from torch."""
    return meta if "backend" in meta or "embedder" not in meta else {**meta, "backend": "torch"}


def _analysis_meta(d: Mapping[str, Any]) -> JSON:
    """scaling.json / routing.json of version 0: what their `meta` states about the study, filled in."""
    return {**d, "meta": _torch_if_unsaid(dict(d["meta"]))} if isinstance(d.get("meta"), Mapping) else dict(d)


def scaling(d: Mapping[str, Any]) -> JSON:
    """`scaling.json` of any version -> FORMAT_VERSION."""
    version = version_of(d, "scaling.json")
    if version == 0 and isinstance(d.get("meta"), Mapping):
        m = dict(d["meta"])
        timing = m.get("timing_s")
        if isinstance(timing, Mapping):  # 0.1.0 before 9ca467f: seconds per stage; the total is kept
            m["timing_s"] = float(timing.get("total") or sum(v for v in timing.values() if isinstance(v, int | float)))
        embed = m.get("embed")
        if isinstance(embed, Mapping):  # it also held "injected_encoder": the stage counters are kept
            m["embed"] = {k: v for k, v in embed.items() if k != "injected_encoder"}
        d = _analysis_meta({**d, "meta": m})
    return _stamped(d)


def routing(d: Mapping[str, Any]) -> JSON:
    """`routing.json` of any version -> FORMAT_VERSION (its shape has not changed since 0.1.0)."""
    if version_of(d, "routing.json") == 0:
        d = _analysis_meta(d)
    return _stamped(d)


def summary(d: Mapping[str, Any]) -> JSON:
    """`summary.json` of any version -> FORMAT_VERSION (rows, tests and checks unchanged since 0.1.0; its
    study view's settings nested by section since 3, as meta.json's)."""
    version = version_of(d, "summary.json")
    view = d.get("meta")
    if version < 3 and isinstance(view, Mapping) and isinstance(view.get("settings"), Mapping):
        d = {**d, "meta": {**view, "settings": nested_settings(view["settings"])}}
    return _stamped(d)
