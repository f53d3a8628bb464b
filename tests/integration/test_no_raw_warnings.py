"""No raw library warning on stderr (issue 38): every line a command writes there is one of its own (`warning:`,
`note:`, `error:`, progress), never a library's warning with the source line under it.

Before the fix BM25 over a registry of emoji-only texts printed numpy's "RuntimeWarning: invalid value encountered
in scalar divide" and the line of bm25s that raised it. A plugin's own `warnings.warn` is routed as one line too.
"""

from __future__ import annotations

import json

from helpers.cli import run_cli

PLUGIN = '''
import warnings
from evaluator.study.archs import Context, Discovery

class Noisy:
    name = "noisy"

    async def retrieve(self, ctx: Context) -> Discovery:
        warnings.warn("this plugin's old API is deprecated;\\n  use the new one")
        return Discovery(ctx.query_hits.ids, ctx.query_hits.scores, plan=bool(ctx.query_hits.ids))
'''


def test_bm25_over_emoji_only_text_and_a_plugins_warning_are_single_lines(tmp_path):
    tools = tmp_path / "tools.jsonl"
    tools.write_text("".join(json.dumps({"tool_name": t, "api_name": a, "api_description": d}) + "\n"
                             for t, a, d in (("🔥", "🎉", "😀 😀"), ("🌧", "☀", "🌈"), ("🚀", "🛸", "✨ ✨ ✨"))))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": 1, "subset": "emoji", "query": "🔥 🎉 ?", "gold": ["🔥::🎉"]}) + "\n")
    (tmp_path / "noisy.py").write_text(PLUGIN)
    done = run_cli("--tools", str(tools), "--queries", str(queries), "--retriever", "bm25", "--model", "sim", "--runs",
                   "1", "--ks", "1,3", "--k", "1", "--archs", f"rtp,{tmp_path / 'noisy.py'}:Noisy", "--out",
                   str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--no-extras",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "RuntimeWarning" not in done.stderr and "scalar divide" not in done.stderr, done.stderr
    assert all(ln.startswith(("warning: ", "note: ")) for ln in lines), done.stderr
    said = [ln for ln in lines if "deprecated" in ln]
    assert len(said) == 1 and said[0].startswith("warning: this plugin's old API is deprecated; use the new one")
    assert "(UserWarning in noisy.py:" in said[0]
