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


def render(res: dict[str, Any]) -> list[str]:
    m = res["machine"]
    pk = m.get("packages", {})
    lines = [f"### {res['title']}", "",
             f"`{res['command']}` — {res['seconds']:.0f} s; {m['cores']} cores ({m['cpu']}"
             f"{', ' + ' '.join(m['cpu_vector']) if m.get('cpu_vector') else ''}), {m['ram_gib']} GiB RAM, "
             f"Python {m['python']}, torch {pk.get('torch')}, sentence-transformers {pk.get('sentence-transformers')}, "
             f"faiss-cpu {pk.get('faiss-cpu')}, openai {pk.get('openai')}, aiohttp {pk.get('aiohttp')}; "
             f"load average {m.get('loadavg_1m')} at start, {m.get('loadavg_1m_end')} at end.", ""]
    lines += _table("results", res["table"]["columns"], res["table"]["rows"])
    for t in res.get("extra_tables", []):
        lines += _table(t["title"], t["columns"], t["rows"])
    for g in res.get("goals", []):
        lines.append(f"- goal **{g['what']}**: {fmt(g['value'], 4)} (target {g['target']}) — "
                     f"{'**met**' if g['met'] else '**missed**'}")
    lines += [f"- {n}" for n in res.get("notes", [])]
    return [*lines, ""]


def update_readme() -> None:
    path = BENCH / "README.md"
    text = path.read_text(encoding="utf-8") if path.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text += f"\n{START}\n{END}\n"
    block: list[str] = []
    for name in ORDER:
        f = RESULTS / f"{name}.json"
        if f.exists():
            block += render(orjson.loads(f.read_bytes()))
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + START + "\n" + "\n".join(block) + END + tail, encoding="utf-8")
