"""The GPU proof (issue 41), run on the GPU machine by `bench/gpu_run.sh` over what `bench/gpu_prepare.py` put in `.gpu/`.

Stages, each timed and recorded in OUT/gpu.json as soon as it ends (a stage that fails records its error and the
next one runs; a stage that would start past `--budget-s` is skipped, and the study is stopped after 240 s, so the
command ends well inside its limit). They run env, data, embed-fp16, study, embed-bf16, embed-fp32, search,
devices: the default path's own figures first, the longest stage second.
- env: the GPU, torch and CUDA, the packages the wheels brought, what `--device auto` picks, whether faiss imports;
- study: `python -m evaluator --model sim --runs 1` on the carried registry and queries (`--device auto`, the
  fp16 weights of `.gpu/model`, an empty cache): every API, query and stub embedded and searched where auto puts
  them; its meta.json's stage times, embedding counters, search engine and peak GPU memory, and its RtP / PtR
  top-5 lists against the CPU's torch fp32 lists carried in `.gpu/reference.json.gz` (`gpu_prepare`);
- embed-fp16, embed-bf16, embed-fp32: the registry embedded again per precision with the model warm (texts/s,
  tokenising and forward seconds, peak GPU memory), the queries and the CPU run's stubs too, searched by the
  torch exact search on the device, and their RtP / PtR / per-stub top-5 lists against the CPU's fp32 ones;
- search: the same vectors searched by the torch search on the device and on the CPU (and FAISS where it
  imports): candidate lists and `exact_search` lists compared, each search timed;
- devices: CPU fp32 and GPU fp32 vectors of the same (fp16-stored) weights for a sample of texts: how far a
  GPU's vectors are from a CPU's (why the embedding cache keeps them apart).

The CPU lists were computed from the original fp32 weights; the GPU machine has the weights rounded to fp16
(what fits the 64 MiB that travels), so "GPU fp32 vs CPU fp32" holds the rounding of the weights too, and
the devices stage separates it. `--sample N` runs every stage on N registry APIs (plus the sampled queries'
gold APIs) and a few queries per subset: a check of the script on a CPU, whose agreement figures mean nothing.

`python -m bench.gpu_run --collect PATH` copies a returned gpu.json to bench/results/gpu.json and regenerates
bench/README.md's results block. Only the standard library is imported at the top: a missing package fails
its stage, not the run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REFERENCE = "reference.json.gz"
PRECISIONS = ("fp16", "bf16", "fp32")
TOP = 5  # the lists compared: top-5 as sets
_STUDY_MAX_S = 240.0  # the study is stopped past this: the stages after it still run
DEEP = 20  # the depth the study keeps and the CPU lists carry
WHEEL_PACKAGES = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
                  "diskcache", "orjson", "json-repair")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- the lists compared


def study_lists(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Per query ('subset/query_id'): RtP's and PtR's ranked ids, the stubs' texts and each stub's ranked ids,
    from a finished study's queries.jsonl (model sim, run 0)."""
    from evaluator.results.plans import stub_text
    from evaluator.results.schema import OutputDir, PtrBlock

    out: dict[str, dict[str, Any]] = {}
    for r in OutputDir(out_dir).iter_records():
        if r.run != 0:
            continue
        entry: dict[str, Any] = {"query": r.query}
        if (rtp := r.arch("rtp")) is not None:
            entry["rtp"] = list(rtp.retrieved[:DEEP])
        ptr = r.arch("ptr")
        if isinstance(ptr, PtrBlock):
            entry["ptr"] = list(ptr.retrieved[:DEEP])
            entry["stubs"] = [stub_text(s) for s in ptr.stubs]
            entry["stub_hits"] = [list(h[:DEEP]) for h in ptr.stub_hits]
        out[f"{r.subset}/{r.query_id}"] = entry
    return out


def agreement(cpu: dict[str, list[str]], gpu: dict[str, list[str]], k: int = TOP, show: int = 20) -> dict[str, Any]:
    """The share of lists (keys in both) whose top-k sets are equal, the share equal in order too, and the
    mismatches named (the first `show`, with what each side ranked)."""
    keys = sorted(set(cpu) & set(gpu))
    same_set = [key for key in keys if set(cpu[key][:k]) == set(gpu[key][:k])]
    same_order = [key for key in keys if cpu[key][:k] == gpu[key][:k]]
    bad = [key for key in keys if set(cpu[key][:k]) != set(gpu[key][:k])]
    return {
        "lists": len(keys), "equal_sets": len(same_set), "equal_order": len(same_order),
        "share": round(len(same_set) / len(keys), 4) if keys else None,
        "share_in_order": round(len(same_order) / len(keys), 4) if keys else None,
        "mismatches": [{"key": key, "cpu": cpu[key][:k], "gpu": gpu[key][:k],
                        "only_cpu": sorted(set(cpu[key][:k]) - set(gpu[key][:k])),
                        "only_gpu": sorted(set(gpu[key][:k]) - set(cpu[key][:k]))} for key in bad[:show]],
        "mismatched": len(bad),
    }


def by_arch(lists: dict[str, dict[str, Any]], arch: str) -> dict[str, list[str]]:
    return {key: e[arch] for key, e in lists.items() if arch in e}


def by_stub(lists: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Each stub's ranked ids, keyed by query and stub text (a stub the other side did not write is not compared)."""
    return {f"{key} | {text}": hits for key, e in lists.items()
            for text, hits in zip(e.get("stubs", []), e.get("stub_hits", []), strict=False)}


def read_reference(travel: Path) -> dict[str, Any]:
    with gzip.open(travel / REFERENCE, "rt", encoding="utf-8") as fh:
        return json.load(fh)


# ---------------------------------------------------------------- the run


class Run:
    """The stages' results as they come, written to OUT/gpu.json after each."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.travel = Path(args.travel)
        self.t0 = time.perf_counter()
        self.stages: dict[str, dict[str, Any]] = {}
        self.facts: dict[str, Any] = {"sample": args.sample, "device_asked": args.device}
        self.machine: dict[str, Any] = {}
        self.keep: dict[str, Any] = {}  # between stages: texts, vectors, the reference

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    @contextlib.contextmanager
    def stage(self, name: str, start_by_s: float | None = None) -> Iterator[dict[str, Any] | None]:
        """Runs the block as stage `name`; yields the dict the stage fills, or None when it is skipped."""
        rec: dict[str, Any] = {"ok": False}
        self.stages[name] = rec
        if start_by_s is not None and self.elapsed() > start_by_s:
            rec.update(skipped=f"not started: {self.elapsed():.0f} s elapsed, past {start_by_s:.0f} s")
            log(f"stage {name}: skipped ({rec['skipped']})")
            self.write()
            yield None
            return
        log(f"stage {name}: start")
        t = time.perf_counter()
        try:
            yield rec
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001 - every failure is recorded; the next stage still runs
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            rec["traceback"] = traceback.format_exc()[-4000:]
            log(f"stage {name}: FAILED {rec['error']}")
        finally:
            rec["seconds"] = round(time.perf_counter() - t, 3)
            log(f"stage {name}: done in {rec['seconds']:.1f} s")
            self.write()

    def write(self) -> None:
        result = summary(self)
        tmp = self.out / "gpu.json.tmp"
        tmp.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
        tmp.replace(self.out / "gpu.json")


def _gpu_stats(torch: Any, device: str) -> dict[str, Any]:
    if not device.startswith("cuda"):
        return {}
    torch.cuda.synchronize(device)
    return {"peak_gpu_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}


def _release(torch: Any, device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _reset_peak(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def stage_env(run: Run, rec: dict[str, Any]) -> None:
    from importlib import metadata

    rec["python"] = platform.python_version()
    rec["cpus"] = os.cpu_count()
    rec["packages"] = {}
    for p in (*WHEEL_PACKAGES, "torch", "transformers", "sentence-transformers", "tokenizers", "numpy", "aiohttp",
              "faiss-cpu"):
        try:
            rec["packages"][p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            rec["packages"][p] = None
    with contextlib.suppress(Exception):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        rec["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()[:300]
    manifest = run.travel / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text(encoding="utf-8"))
        run.facts["commit"] = m.get("commit")
        rec["prepared"] = {k: m.get(k) for k in ("commit", "dirty", "created")}
    import torch

    from evaluator.retrieval.backends import importable
    from evaluator.retrieval.embed import _auto_device

    rec["torch"] = torch.__version__
    rec["cuda"] = torch.version.cuda
    rec["cuda_available"] = torch.cuda.is_available()
    rec["faiss_importable"] = importable("faiss")
    rec["auto_device"] = _auto_device()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        rec["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                      "multiprocessors": p.multi_processor_count}
        run.facts["gpu"] = p.name
    device = run.args.device
    if device == "auto":
        device = rec["auto_device"]
        if torch.cuda.is_available() and device != "cuda":
            rec["auto_note"] = "--device auto picked the CPU on a machine whose torch sees a GPU; cuda is used below"
            device = "cuda"
    run.facts["device"] = device
    log(f"device {device}; GPU {run.facts.get('gpu')}; torch {torch.__version__} CUDA {torch.version.cuda}; "
        f"faiss {'importable' if rec['faiss_importable'] else 'absent'}")


def load_data(run: Run) -> None:
    """The carried registry and queries (a sample with --sample), the CPU's lists and the stubs to embed."""
    import numpy as np

    from evaluator.data import Warnings, find_query_files, load_query_files, load_registry

    data = run.travel / "toolbench"
    registry = load_registry(data, "full", Warnings())
    queries = load_query_files(find_query_files(data), registry, Warnings())
    ref = read_reference(run.travel)
    if run.args.sample:
        per = max(2, run.args.sample // 500)
        seen: dict[str, int] = {}
        queries = [q for q in queries if (seen.__setitem__(q.subset, seen.get(q.subset, 0) + 1) or seen[q.subset]) <= per]
    run.keep.update(registry=registry, queries=queries, ref=ref["queries"])
    run.facts["reference"] = {k: v for k, v in ref.items() if k != "queries"}
    texts = registry.texts()
    rows = np.arange(len(texts))
    if run.args.sample:
        gold = {api for q in queries for ids in q.gold.values() for api in ids}
        index = {api: i for i, api in enumerate(registry.ids)}
        rows = np.unique(np.concatenate([np.arange(min(run.args.sample, len(texts))),
                                         np.array([index[a] for a in gold if a in index], np.int64)]))
    run.keep["rows"] = rows  # registry rows embedded by the precision stages
    run.keep["texts"] = [texts[i] for i in rows]
    keys = [f"{q.subset}/{q.query_id}" for q in queries]
    stubs, owners = [], []
    for j, key in enumerate(keys):
        for text in run.keep["ref"].get(key, {}).get("stubs", []):
            stubs.append(text)
            owners.append(j)
    run.keep.update(keys=keys, stubs=stubs, owners=owners)
    run.facts["texts"] = {"registry": len(run.keep["texts"]), "queries": len(queries), "stubs": len(stubs)}


def _sample_files(run: Run, folder: Path) -> list[str]:
    """--tools/--queries/--limit for the study on the sample (the APIs embedded by the precision stages)."""
    registry, rows = run.keep["registry"], run.keep["rows"]
    import gzip as gz

    keep = {registry.ids[i] for i in rows}
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    with gz.open(run.travel / "toolbench" / "registry" / "apis.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if f"{r['tool_name']}::{r['api_name']}" in keep:
                lines.append(line)
    (folder / "apis.jsonl").write_text("".join(lines), encoding="utf-8")
    per = max(2, run.args.sample // 500)
    return ["--tools", str(folder / "apis.jsonl"), "--queries", str(run.travel / "toolbench" / "queries"),
            "--limit", str(per)]


def stage_study(run: Run, rec: dict[str, Any]) -> None:
    work = Path(run.args.work)
    study_out, cache = work / "study", work / "cache"
    for p in (study_out, cache):
        if p.exists():
            subprocess.run(["rm", "-rf", str(p)], check=True)
    data = ["--data", str(run.travel / "toolbench")] if not run.args.sample else _sample_files(run, work / "sample")
    # --device auto as a user runs it, unless another device was asked or auto missed the GPU (env's auto_note)
    device = "auto" if run.args.device == "auto" and not run.stages["env"].get("auto_note") else run.facts["device"]
    cmd = [sys.executable, "-m", "evaluator", *data, "--model", "sim", "--runs", "1", "--device", device,
           "--embedder", str(run.travel / "model"), "--cache-dir", str(cache), "--out", str(study_out),
           "--no-progress", "--no-extras"]
    rec["command"] = " ".join(cmd[1:])
    log("study: " + rec["command"])
    t = time.perf_counter()
    timeout = max(60.0, min(_STUDY_MAX_S, run.args.budget_s - run.elapsed()))
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    rec["wall_s"] = round(time.perf_counter() - t, 2)
    rec["returncode"] = done.returncode
    rec["stderr_tail"] = done.stderr[-3000:]
    print(done.stderr[-3000:], flush=True)
    meta_file = study_out / "meta.json"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        rt = meta.get("runtime", {})
        rec.update(timings=rt.get("timings"), embed=rt.get("embed"), embed_runtime=rt.get("embed_runtime"),
                   search=rt.get("search"), peak_gpu_mib=rt.get("peak_gpu_mib"), peak_rss_mib=rt.get("peak_rss_mib"),
                   precision=meta.get("precision"), backend=meta.get("backend"))
        (run.out / "study-meta.json").write_text(meta_file.read_text(encoding="utf-8"), encoding="utf-8")
        with contextlib.suppress(OSError):
            (run.out / "study-report.md").write_bytes((study_out / "report.md").read_bytes())
    if done.returncode != 0:
        raise RuntimeError(f"the study exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    lists = study_lists(study_out)
    ref = run.keep["ref"]
    rec["rtp_top5"] = agreement(by_arch(ref, "rtp"), by_arch(lists, "rtp"))
    rec["ptr_top5"] = agreement(by_arch(ref, "ptr"), by_arch(lists, "ptr"))
    same_stubs = [k for k in lists if k in ref and lists[k].get("stubs") == ref[k].get("stubs")]
    rec["stubs_as_cpu"] = {"queries": len(set(lists) & set(ref)), "same_stub_texts": len(same_stubs)}
    rec["stub_top5"] = agreement(by_stub(ref), by_stub(lists))
    log(f"study: {rec['wall_s']:.1f} s; RtP top-5 = CPU fp32 for {rec['rtp_top5']['share']}, PtR {rec['ptr_top5']['share']}; "
        f"search {rec.get('search')}; peak GPU {rec.get('peak_gpu_mib')} MiB")


def _timed(torch: Any, device: str, fn: Callable[[], Any]) -> tuple[Any, float]:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t


def _ranked(run: Run, index: Any, vecs: Any, rows_of: Callable[[Any], list[str]]) -> dict[str, Any]:
    """RtP, PtR and per-stub ranked ids of the stage's vectors, keyed as `study_lists` keys them."""
    from evaluator.retrieval import ranking

    qv, sv = vecs
    keys, stubs, owners = run.keep["keys"], run.keep["stubs"], run.keep["owners"]
    _, q_rows = index.exact_search(qv, DEEP)
    s_scores, s_rows = index.exact_search(sv, DEEP)
    ptr = ranking.ptr_from_hits(s_scores, s_rows, owners, len(keys), DEEP, [TOP])
    out: dict[str, dict[str, Any]] = {key: {"rtp": rows_of(q_rows[j]), "ptr": rows_of(ptr[j].rows), "stubs": [],
                                            "stub_hits": []} for j, key in enumerate(keys)}
    for text, owner, hits in zip(stubs, owners, s_rows, strict=True):
        out[keys[owner]]["stubs"].append(text)
        out[keys[owner]]["stub_hits"].append(rows_of(hits))
    return out


def stage_embed(run: Run, rec: dict[str, Any], precision: str) -> None:
    import numpy as np
    import torch

    from evaluator.retrieval.embed import Embedder
    from evaluator.retrieval.index import VectorIndex

    device = run.facts["device"]
    _release(torch, device)  # the last stage's model and vectors on the device
    if precision == "fp16" and not device.startswith("cuda"):
        raise RuntimeError("fp16 runs on a GPU only")
    emb = Embedder(str(run.travel / "model"), device=device, precision=precision, backend="torch", cache_dir=None,
                   progress=False)
    texts, queries, stubs = run.keep["texts"], [q.text for q in run.keep["queries"]], run.keep["stubs"]
    _, warm = _timed(torch, device, lambda: emb.encode(texts[:1024]))  # loads the model, starts CUDA and its kernels
    rec["warm_up_s"] = round(warm, 2)
    rec["model_load_s"] = round(emb.stats.model_load_s, 2)
    rec["runtime"] = emb.description
    before = {k: getattr(emb.stats, k) for k in ("tokenize_s", "infer_s")}
    _reset_peak(torch, device)
    api, secs = _timed(torch, device, lambda: emb.encode(texts, desc="registry"))
    rec["registry"] = {"texts": len(texts), "seconds": round(secs, 3), "texts_per_s": round(len(texts) / secs, 1),
                       "tokenize_s": round(emb.stats.tokenize_s - before["tokenize_s"], 3),
                       "forward_s": round(emb.stats.infer_s - before["infer_s"], 3), **_gpu_stats(torch, device)}
    qv, q_s = _timed(torch, device, lambda: emb.encode(queries))
    sv, s_s = _timed(torch, device, lambda: emb.encode(stubs) if stubs else np.zeros((0, api.shape[1]), np.float32))
    rec["queries_s"], rec["stubs_s"] = round(q_s, 3), round(s_s, 3)
    rec["nonfinite_vectors"] = int((~np.isfinite(api).all(axis=1)).sum())
    _reset_peak(torch, device)
    index, build_s = _timed(torch, device, lambda: VectorIndex(api, device=device))
    _, search_q = _timed(torch, device, lambda: index.exact_search(qv, DEEP))
    _, search_s = _timed(torch, device, lambda: index.exact_search(sv, DEEP))
    rec["search"] = {"engine": index.description, "index_s": round(build_s, 3), "queries_s": round(search_q, 4),
                     "stubs_s": round(search_s, 4), **_gpu_stats(torch, device)}
    reg_ids = run.keep["registry"].ids
    rows = run.keep["rows"]
    lists = _ranked(run, index, (qv, sv), lambda r: [reg_ids[rows[i]] for i in r])
    ref = run.keep["ref"]
    rec["rtp_top5"] = agreement(by_arch(ref, "rtp"), by_arch(lists, "rtp"))
    rec["ptr_top5"] = agreement(by_arch(ref, "ptr"), by_arch(lists, "ptr"))
    rec["stub_top5"] = agreement(by_stub(ref), by_stub(lists))
    run.keep[f"vectors-{precision}"] = (api, qv, sv)
    run.keep[f"lists-{precision}"] = lists
    log(f"embed {precision}: registry {rec['registry']['texts_per_s']:,.0f} texts/s ({secs:.2f} s; tokenise "
        f"{rec['registry']['tokenize_s']:.2f} s, forward {rec['registry']['forward_s']:.2f} s); RtP top-5 = CPU fp32 "
        f"{rec['rtp_top5']['share']}, PtR {rec['ptr_top5']['share']}, stubs {rec['stub_top5']['share']}")


def stage_search(run: Run, rec: dict[str, Any]) -> None:
    """The device's torch search against the CPU's torch search (and FAISS where it imports) on the same vectors."""
    import numpy as np
    import torch

    from evaluator.retrieval.index import VectorIndex, choose_engine

    device = run.facts["device"]
    name = next((f"vectors-{p}" for p in PRECISIONS if f"vectors-{p}" in run.keep), None)
    if name is None:
        raise RuntimeError("no precision stage left vectors to search")
    api, qv, sv = run.keep[name]
    both = np.concatenate([qv, sv])
    rec["vectors"] = name
    engines = [(device, "torch"), ("cpu", "torch")] + ([("cpu", "faiss")] if choose_engine("auto", "cpu") == "faiss" else [])
    found: dict[str, Any] = {}
    for dev, engine in dict.fromkeys(engines):
        index = VectorIndex(api, device=dev, engine=engine)
        for k in (DEEP + 8, 100 + 8):
            (cand_s, cand), t_raw = _timed(torch, dev, lambda index=index, k=k: index.search(both, k))
            (_, exact), t_exact = _timed(torch, dev, lambda index=index, k=k: index.exact_search(both, k - 8))
            found[f"{index.description} k={k}"] = (cand, exact, cand_s)
            rec.setdefault("timings", {})[f"{index.description} k={k}"] = {
                "search_s": round(t_raw, 4), "exact_search_s": round(t_exact, 4), "texts": len(both)}
    base = {k: v for k, v in found.items() if k.startswith(f"torch exact top-k ({device})")}
    rec["compared"] = {}
    for key, (cand, exact, cand_s) in found.items():
        ref_key = next(b for b in base if b.endswith(key.rsplit(" ", 1)[1]))
        if key == ref_key:
            continue
        rc, re_, rs = base[ref_key]
        rec["compared"][f"{key} vs {ref_key}"] = {
            "same_candidate_lists": round(float((cand == rc).all(axis=1).mean()), 4),
            "same_exact_lists": round(float((exact == re_).all(axis=1).mean()), 4),
            "max_score_diff": float(np.abs(cand_s - rs).max()) if len(cand_s) else 0.0,
        }
    log("search: " + "; ".join(f"{k}: exact lists equal {v['same_exact_lists']}" for k, v in rec["compared"].items()))


def stage_devices(run: Run, rec: dict[str, Any]) -> None:
    """CPU fp32 vectors of the same weights as the GPU fp32 stage, for a sample of texts and the queries."""
    import numpy as np

    from evaluator.retrieval.embed import Embedder

    if not run.facts["device"].startswith("cuda"):
        rec["skipped"] = "no GPU: nothing to compare the CPU with"
        return
    if "vectors-fp32" not in run.keep:
        raise RuntimeError("needs the embed-fp32 stage's vectors")
    api, qv, _ = run.keep["vectors-fp32"]
    n = min(run.args.device_sample, len(api))
    pick = np.linspace(0, len(api) - 1, n).astype(np.int64)
    texts = [run.keep["texts"][i] for i in pick] + [q.text for q in run.keep["queries"]]
    emb = Embedder(str(run.travel / "model"), device="cpu", precision="fp32", backend="torch", cache_dir=None, progress=False)
    t = time.perf_counter()
    cpu = emb.encode(texts)
    rec["cpu_seconds"] = round(time.perf_counter() - t, 2)
    gpu = np.concatenate([api[pick], qv])
    cos = (cpu * gpu).sum(axis=1)
    rec.update(texts=len(texts), max_abs_diff=float(np.abs(cpu - gpu).max()), min_cosine=float(cos.min()),
               mean_cosine=float(cos.mean()), identical_vectors=int((cpu == gpu).all(axis=1).sum()),
               cpu_runtime=emb.description)
    log(f"devices: CPU fp32 vs GPU fp32 (same weights) on {len(texts)} texts: max |diff| {rec['max_abs_diff']:.2e}, "
        f"min cosine {rec['min_cosine']:.8f}")


# ---------------------------------------------------------------- the result file


def _share(rec: dict[str, Any], key: str) -> Any:
    return (rec.get(key) or {}).get("share")


def summary(run: Run) -> dict[str, Any]:
    """bench's result shape (`bench.common.Result.to_json`), from whatever stages ran."""
    st = run.stages
    gpu = run.facts.get("gpu") or run.facts.get("device") or "?"
    rows = []
    for p in PRECISIONS:
        s = st.get(f"embed-{p}", {})
        reg = s.get("registry", {})
        why = "" if s.get("ok") else " - " + (s.get("skipped") or s.get("error") or "not run")[:80]
        rows.append([f"torch {p} ({run.facts.get('device', '?')}){why}", reg.get("texts_per_s"), reg.get("seconds"),
                     reg.get("tokenize_s"), reg.get("forward_s"), reg.get("peak_gpu_mib"), _share(s, "rtp_top5"),
                     _share(s, "ptr_top5"), _share(s, "stub_top5")])
    study = st.get("study", {})
    timings, embed = study.get("timings") or {}, study.get("embed") or {}
    tables = []
    if study:
        tables.append({"title": "the study, python -m evaluator --model sim --runs 1 --device auto (first run, empty cache)",
                       "columns": ["embedding path", "search", "wall s", "embed s", "texts embedded", "model load s",
                                   "tokenise s", "forward s", "RtP search s", "LLM s", "peak GPU MiB",
                                   "RtP top-5 = CPU fp32", "PtR top-5", "stub top-5"],
                       "rows": [[study.get("embed_runtime"), study.get("search"), study.get("wall_s"),
                                 timings.get("embed_s"), embed.get("embedded"), embed.get("model_load_s"),
                                 embed.get("tokenize_s"), embed.get("infer_s"), timings.get("rtp_search_s"),
                                 timings.get("llm_s"), study.get("peak_gpu_mib"), _share(study, "rtp_top5"),
                                 _share(study, "ptr_top5"), _share(study, "stub_top5")]]})
    search = st.get("search", {})
    if search.get("timings"):
        compared = search.get("compared", {})
        srows = []
        for key, t in search["timings"].items():
            vs = next((v for c, v in compared.items() if c.startswith(key + " vs ")), {})
            srows.append([key, t.get("texts"), t.get("search_s"), t.get("exact_search_s"),
                          vs.get("same_candidate_lists"), vs.get("same_exact_lists")])
        tables.append({"title": f"search of the {search.get('vectors')} queries and stubs: each engine, and its lists "
                                f"against the torch search on {run.facts.get('device')}",
                       "columns": ["engine", "texts", "search s", "exact_search s", "same candidates", "same exact lists"],
                       "rows": srows})
    stage_rows = [[f"study: {k}", v] for k, v in sorted(timings.items())]
    stage_rows += [[f"stage {k}", v.get("seconds")] for k, v in st.items()]
    tables.append({"title": "stage times (s)", "columns": ["stage", "seconds"], "rows": stage_rows})
    goals = []
    if study.get("rtp_top5"):
        v = study["rtp_top5"]["share"]
        goals.append({"what": f"study RtP top-5 lists equal to CPU fp32 ({study.get('embed_runtime')}, "
                              f"{study.get('search')})", "value": v, "target": ">= 0.99", "met": v is not None and v >= 0.99})
    notes = [
        f"GPU: {gpu}; device {run.facts.get('device')}; commit {run.facts.get('commit')}; "
        f"{'SAMPLE of ' + str(run.args.sample) + ' APIs: agreement figures mean nothing' if run.args.sample else 'full data'}.",
        "Agreement: the share of queries (stubs) whose top-5 set equals the CPU's torch fp32 list (original fp32 weights); "
        "the GPU runs the weights rounded to fp16 (what travels), so its fp32 includes that rounding.",
    ]
    for name, s in [("study", study)] + [(f"embed-{p}", st.get(f"embed-{p}", {})) for p in PRECISIONS]:
        for arch in ("rtp", "ptr"):
            bad = (s.get(f"{arch}_top5") or {}).get("mismatches") or []
            if bad:
                notes.append(f"{name} {arch} top-5 mismatches ({(s.get(f'{arch}_top5') or {}).get('mismatched')}): " + "; ".join(
                    f"{m['key']} (CPU only {', '.join(m['only_cpu'])}; GPU only {', '.join(m['only_gpu'])})" for m in bad[:5]))
    dev = st.get("devices", {})
    if dev.get("max_abs_diff") is not None:
        notes.append(f"CPU vs GPU fp32 vectors of the same weights ({dev.get('texts')} texts): max |difference| "
                     f"{dev['max_abs_diff']:.2e}, min cosine {dev.get('min_cosine'):.8f}, identical {dev.get('identical_vectors')}.")
    for name, s in st.items():
        if s.get("error") or s.get("skipped"):
            notes.append(f"stage {name}: {s.get('error') or s.get('skipped')}")
    return {
        "name": "gpu", "title": f"GPU path: embedding and exact search on {gpu}", "command": "bash bench/gpu_run.sh "
        + " ".join(sys.argv[1:]), "seconds": round(run.elapsed(), 1), "machine": run.machine, "goals": goals,
        "table": {"columns": ["path (registry embedded again, model warm)", "registry texts/s", "registry s",
                              "tokenise s", "forward s", "peak GPU MiB", "RtP top-5 = CPU fp32", "PtR top-5",
                              "stub top-5"], "rows": rows},
        "extra_tables": tables, "notes": notes, "data": {"facts": run.facts, "stages": st},
    }


def _machine() -> dict[str, Any]:
    try:
        from bench.common import machine

        return machine()
    except Exception as e:  # noqa: BLE001 - psutil or orjson missing: the facts the README needs, from the stdlib
        return {"cores": os.cpu_count(), "cpu": platform.processor() or "?", "ram_gib": None,
                "python": platform.python_version(), "packages": {}, "loadavg_1m": round(os.getloadavg()[0], 2),
                "error": f"{type(e).__name__}: {e}"}


def collect(path: Path) -> Path:
    """A returned gpu.json -> bench/results/gpu.json, and the README's results block regenerated."""
    result = json.loads(path.read_text(encoding="utf-8"))
    if result.get("name") != "gpu" or "data" not in result or "table" not in result:
        raise SystemExit(f"{path}: not a gpu.json written by bench/gpu_run.py")
    if result["data"].get("facts", {}).get("sample"):
        raise SystemExit(f"{path}: a --sample run (a check of the script), not the proof; run it without --sample")
    dest = REPO / "bench" / "results" / "gpu.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    from bench.readme import update_readme

    update_readme()
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_run", description=__doc__.split("\n")[0])
    ap.add_argument("--travel", default=str(REPO / ".gpu"), help="what bench/gpu_prepare.py built (default .gpu)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-out"), help="where gpu.json goes (default $OUT)")
    ap.add_argument("--work", default="/tmp/gpu-work", help="scratch: the study's output and cache")
    ap.add_argument("--device", default="auto", help="auto (default: what the study's --device auto picks), cuda, cpu")
    ap.add_argument("--precisions", default=",".join(PRECISIONS), help="the precision stages (default fp16,bf16,fp32)")
    ap.add_argument("--sample", type=int, default=0, help="N registry APIs and a few queries: a check of the script")
    ap.add_argument("--budget-s", type=float, default=330.0, help="no stage starts after this many seconds (default 330)")
    ap.add_argument("--device-sample", type=int, default=2048, help="texts embedded on the CPU by the devices stage")
    ap.add_argument("--collect", metavar="GPU_JSON", help="copy a returned gpu.json to bench/results/ and stop")
    args = ap.parse_args(argv)
    if args.collect:
        print(f"wrote {collect(Path(args.collect))}")
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run = Run(args)
    run.machine = _machine()
    log(f"gpu_run: out {run.out}, travel {run.travel}, budget {args.budget_s:.0f} s")
    with run.stage("env") as rec:
        if rec is not None:
            stage_env(run, rec)
    if "device" not in run.facts:
        run.facts["device"] = "cpu" if args.device == "auto" else args.device
    with run.stage("data") as rec:
        if rec is not None:
            load_data(run)
            rec.update(run.facts.get("texts", {}))
    if "ref" not in run.keep:
        log("no data: nothing more can run")
        return 1
    precisions = [p for p in args.precisions.split(",") if p]
    # The default path's figures first (seconds), then the study (the longest stage), then the other paths.
    for i, p in enumerate(precisions):
        if i == 1:
            with run.stage("study", start_by_s=args.budget_s * 0.5) as rec:
                if rec is not None:
                    stage_study(run, rec)
        with run.stage(f"embed-{p}", start_by_s=args.budget_s) as rec:
            if rec is not None:
                stage_embed(run, rec, p)
    if len(precisions) < 2:
        with run.stage("study", start_by_s=args.budget_s * 0.5) as rec:
            if rec is not None:
                stage_study(run, rec)
    with run.stage("search", start_by_s=args.budget_s) as rec:
        if rec is not None:
            stage_search(run, rec)
    with run.stage("devices", start_by_s=args.budget_s * 0.9) as rec:
        if rec is not None:
            stage_devices(run, rec)
    run.machine["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    run.write()
    failed = [k for k, v in run.stages.items() if not v.get("ok")]
    log(f"gpu_run: done in {run.elapsed():.0f} s; wrote {run.out / 'gpu.json'}" + (f"; not ok: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
