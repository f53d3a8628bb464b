"""One redactor for every string that leaves the process: API keys become `[REDACTED:ENV_NAME]`.

It knows the value of every configured key: the environment variables `key_envs` lists (each profile in
`configs/models/` names one in `api_key_env`, each provider of `configs/providers.toml` its own, and every other
profile file loaded adds its own through `watch_env`, called by the profile loader for `--model
path.toml`), read from the environment at each call so a key set later is still caught. Error text also
loses anything shaped like a provider key (`AIza...`, `sk-...`, a `Bearer` token), which may be a key we
do not know (a proxy echoing another header).

Where it runs, at every boundary text from a server or a plugin crosses: server and batch errors
(`redact`), a 200 reply's text as it is read (`llm.reply.read_reply`: content and reasoning, so the cache,
the records and everything made from them hold no key), the response cache's entries, every file of an
output folder (`results.schema`: queries.jsonl lines, meta.json, summary.json, report.md; `app.viewer`: the
viewer's page and parts), request and result files, the CLI's lines and every note or warning
(`core.progress`, the logging filter). Replies and files lose only configured keys (`scrub`): a reply's
text may hold words shaped like a key that are no secret.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
import traceback
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from evaluator.core.paths import MODELS_DIR, PROVIDERS_FILE

# Shorter values would turn ordinary words of an error into redaction marks and are no secret worth
# the name (a local server's placeholder key); every provider key is far longer.
MIN_KEY_LEN = 6
# Shapes of provider keys met in error text even when the key is not ours.
KEY_SHAPES = re.compile(r"(AIza[0-9A-Za-z_\-]{20,}|sk-[A-Za-z0-9_\-]{12,}|Bearer\s+[A-Za-z0-9._~+/=\-]{8,})")

_watched: set[str] = set()  # env var names of profiles loaded from elsewhere than configs/models
_configured: set[str] | None = None  # env var names the bundled profiles declare (read once)


def _profile_envs(models_dir: Path = MODELS_DIR, providers: Path = PROVIDERS_FILE) -> set[str]:
    """The `api_key_env` of every bundled profile (in its [connection], or at the top of a flat one) and of every
    provider's table (providers' own key variables are redacted whether or not a profile names them: an SDK reads
    them by itself)."""
    tables: list[object] = []
    for f in [*sorted(models_dir.glob("*.toml")), providers]:
        try:
            doc = tomllib.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue  # the profile (or provider) loader reports a broken file when it is used
        tables += [doc, doc.get("connection")] if f != providers else list(doc.values())
    names = set()
    for t in tables:
        env = t.get("api_key_env") if isinstance(t, dict) else None
        if isinstance(env, str) and env:
            names.add(env)
    return names


def watch_env(name: str | None) -> None:
    """Redact the value of env var `name` from now on (a profile's `api_key_env`)."""
    if name:
        _watched.add(name)


def key_envs() -> list[str]:
    """The one list of environment variables whose values are secrets: the bundled profiles' `api_key_env`,
    every provider's (configs/providers.toml) and every watched one (a profile loaded from a path)."""
    global _configured
    if _configured is None:
        _configured = _profile_envs()
    return sorted(_configured | _watched)


def known_keys(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """key value -> the env var holding it, for every configured key set in the environment."""
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for name in key_envs():
        value = env.get(name, "").strip()
        if len(value) >= MIN_KEY_LEN:
            out[value] = name
    return out


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every configured key (and `secrets`, keys handed over directly) and key shapes replaced."""
    keys = known_keys()
    for s in secrets:
        if s and len(s.strip()) >= MIN_KEY_LEN:
            keys.setdefault(s.strip(), "key")
    for value in sorted(keys, key=len, reverse=True):  # a key holding another is replaced whole
        if value in text:
            text = text.replace(value, f"[REDACTED:{keys[value]}]")
    return KEY_SHAPES.sub("[REDACTED]", text)


def redact_keys(data: bytes) -> bytes:
    """File content with configured keys replaced, nothing else touched (prompts and replies stay as they are)."""
    for value, name in sorted(known_keys().items(), key=lambda kv: len(kv[0]), reverse=True):
        data = data.replace(value.encode(), f"[REDACTED:{name}]".encode())
    return data


def scrub(text: str) -> str:
    """`text` (a reply, a plugin's trace, a file's content) with configured keys replaced and nothing else
    touched: no key shapes, so a model's words that merely look like a key stay as they are."""
    for value, name in sorted(known_keys().items(), key=lambda kv: len(kv[0]), reverse=True):
        if value in text:
            text = text.replace(value, f"[REDACTED:{name}]")
    return text


class RedactFilter(logging.Filter):
    """A log handler's filter: each record's message leaves with keys redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()
        return True


def redacted_traceback(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> str:
    """A crash's traceback as Python prints it, with keys redacted (the CLI's `sys.excepthook`)."""
    return redact("".join(traceback.format_exception(kind, exc, tb)))


# Query parameters that carry credentials in a base URL (Gemini's `?key=`, signed URLs, proxies' tokens).
_SECRET_PARAM = re.compile(r"key|token|secret|sig|pass|auth|credential", re.IGNORECASE)


def mask(secret: str | None) -> str:
    """How a key appears in reprs: whether it is set, nothing of its value."""
    return "***" if secret else "<unset>"


def redact_url(url: str) -> str:
    """A URL fit for meta.json: the user and password in it and the values of credential-like query
    parameters become `[REDACTED]`, then `redact` runs on the rest (a configured key anywhere in it)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return redact(url)
    netloc = parts.netloc if "@" not in parts.netloc else "[REDACTED]@" + parts.netloc.rsplit("@", 1)[1]
    query = "&".join(f"{name}=[REDACTED]" if _SECRET_PARAM.search(name := raw.partition("=")[0]) else raw
                     for raw in parts.query.split("&"))
    return redact(urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query)))
