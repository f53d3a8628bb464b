"""report.md's text helpers (issue 38): a normal text is written as before (HTML escaped, a `|` kept in its cell:
a whole study on markup-laden texts, tests/integration/test_report_escaping.py)."""

from __future__ import annotations

from evaluator.render.fmt import code, text


def test_normal_text_is_written_as_before():
    for s in ("Show me the last 20 lines of /var/log/app/server.log.", "get_player_transfers (G1, 5 days)", "Ünïcödé – ok"):
        assert text(s) == s and code(s) == f"`{s}`"
    assert text("a <b> & c | d") == "a &lt;b&gt; &amp; c \\| d"
    assert text("[x](javascript:alert(1)) [REDACTED:K]") == "[x]\\(javascript:alert(1)) [REDACTED:K]"
    assert code("x`y|z") == "`x'y\\|z`" and code("a<b>") == "a&lt;b&gt;"
