"""`python -m simulator --host 127.0.0.1 --port P [knobs]`: run the simulator.

Every `SimConfig` field is a flag (`--p-503 0.1`, `--rate-style gemini`, `--script 429,500`).
With `--port 0` a free port is chosen. Once listening, one JSON line goes to stdout:
`{"host": ..., "port": ..., "base_url": "http://host:port/v1"}`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
from typing import Any

import orjson

from simulator.server import SimConfig, config_from, serve


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m simulator", description="OpenAI-compatible LLM simulator")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    ap.add_argument("--config-json", help="SimConfig fields as a JSON object (flags override it)")
    ap.add_argument("--exit-with-parent", action="store_true", help="stop when the launching process dies")
    for f in dataclasses.fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        if kind == "bool":
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif kind.startswith("list"):
            ap.add_argument(flag, type=lambda s: [x for x in s.split(",") if x], default=None, help="comma-separated")
        elif kind.startswith("float"):
            ap.add_argument(flag, type=float, default=None)
        elif kind.startswith("int"):
            ap.add_argument(flag, type=int, default=None)
        else:
            ap.add_argument(flag, default=None)
    return ap


async def _watch_parent(ppid: int) -> None:
    # Orphaned simulators would hold ports and CPU after a crashed test run; poll cheaply.
    while os.getppid() == ppid:
        await asyncio.sleep(0.5)


async def _main(args: argparse.Namespace, cfg: SimConfig) -> None:
    runner, port = await serve(cfg, args.host, args.port)
    line = {"host": args.host, "port": port, "base_url": f"http://{args.host}:{port}/v1"}
    sys.stdout.write(orjson.dumps(line).decode() + "\n")
    sys.stdout.flush()
    try:
        if args.exit_with_parent:
            await _watch_parent(os.getppid())
        else:
            await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    knobs: dict[str, Any] = orjson.loads(args.config_json) if args.config_json else {}
    for f in dataclasses.fields(SimConfig):
        v = getattr(args, f.name)
        if v is not None:
            knobs[f.name] = v
    try:
        cfg = config_from(None, **knobs)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"simulator: {e}") from e
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args, cfg))


if __name__ == "__main__":
    main()
