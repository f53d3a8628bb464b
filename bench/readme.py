"""Regenerates the results block of `bench/README.md` from `bench/results/*.json`."""

from __future__ import annotations

from typing import Any

import orjson

from .common import BENCH, RESULTS, fmt

START, END = "<!-- results:start -->", "<!-- results:end -->"
ORDER = ("fanout", "overhead", "embedding", "embed_backends", "embed_shared", "embed_shared-embedder", "embed_first_run",
         "embed_runtime", "warm_run", "resume", "memory", "batch", "shared_rate", "ray_engine", "gpu")


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> list[str]:
    out = [f"**{title}**", "", "| " + " | ".join(columns) + " |", "|" + "|".join(["---"] * len(columns)) + "|"]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def measured(stamp: dict[str, Any] | None) -> str:
    """The stamp in words: the commit (and whether the tree differed from it), when, and the load."""
    if not stamp:
        return "**not stamped**: commit and load unknown"
    load = stamp.get("load") or {}
    start, end = (load.get("start") or [None])[0], (load.get("end") or [None])[0]
    if stamp.get("legacy"):
        return (f"commit not recorded (written before results were stamped; the file came in "
                f"`{str(stamp.get('committed_in'))[:9]}`); load average {start} at start, {end} at end")
    dirty = stamp.get("dirty_paths") or []
    tree = (f"with uncommitted changes to {len(dirty)} path(s): {', '.join(dirty[:3])}" if dirty else "clean tree")
    return (f"measured on commit `{str(stamp.get('commit'))[:9]}` ({tree}) at {stamp.get('measured')}; "
            f"load average {start} at start, at most {load.get('max_1m')}, {end} at end")


def render(res: dict[str, Any]) -> list[str]:
    m = res["machine"]
    pk = m.get("packages", {})
    lines = [f"### {res['title']}", "",
             f"`{res['command']}` — {res['seconds']:.0f} s; {m['cores']} cores ({m['cpu']}"
             f"{', ' + ' '.join(m['cpu_vector']) if m.get('cpu_vector') else ''}), {m['ram_gib']} GiB RAM, "
             f"Python {m['python']}, torch {pk.get('torch')}, sentence-transformers {pk.get('sentence-transformers')}, "
             f"faiss-cpu {pk.get('faiss-cpu')}, openai {pk.get('openai')}, aiohttp {pk.get('aiohttp')}; "
             f"{measured(res.get('stamp'))}.", ""]
    lines += _table("results", res["table"]["columns"], res["table"]["rows"])
    for t in res.get("extra_tables", []):
        lines += _table(t["title"], t["columns"], t["rows"])
    for g in res.get("goals", []):
        lines.append(f"- goal **{g['what']}**: {fmt(g['value'], 4)} (target {g['target']}) — "
                     f"{'**met**' if g['met'] else '**missed**'}")
    lines += [f"- {n}" for n in res.get("notes", [])]
    return [*lines, ""]


def block() -> str:
    """The results block as the JSON files present make it (CI checks the README holds exactly this)."""
    lines: list[str] = []
    for name in ORDER:
        f = RESULTS / f"{name}.json"
        if f.exists():
            lines += render(orjson.loads(f.read_bytes()))
    return "\n".join(lines)


def readme_block(text: str) -> str | None:
    """The results block of a README's text (None when it has no markers)."""
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0].removeprefix("\n")


def update_readme() -> None:
    path = BENCH / "README.md"
    text = path.read_text(encoding="utf-8") if path.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text += f"\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + START + "\n" + block() + END + tail, encoding="utf-8")
