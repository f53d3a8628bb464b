#!/usr/bin/env bash
# The GPU proof of issue 41, as one command on the GPU machine (bench/README.md, "GPU path"): from the
# repository root, with `.gpu` (bench/gpu_prepare.py) carried:   bash bench/gpu_run.sh
# It installs the carried wheels into /tmp/site (no index: nothing can be fetched there), then runs
# bench/gpu_run.py, which writes $OUT/gpu.json after every stage; everything printed also goes to
# $OUT/log.txt. Arguments go to bench/gpu_run.py (e.g. --device cpu --sample 1500 to check the script on a CPU).
# PYTHON (default python3: the image's, with torch) and GPU_NO_WHEELS=1 (use what that Python has) are for
# such checks.
set -euo pipefail
OUT="${OUT:-/tmp/gpu-out}"
PY="${PYTHON:-python3}"
SITE="${GPU_SITE:-/tmp/site}"
mkdir -p "$OUT"
LOG="$OUT/log.txt"
say() { echo "== $(date -Is) $*" | tee -a "$LOG"; }
say "bench/gpu_run.sh in $PWD; OUT=$OUT; $("$PY" -V 2>&1)"
if [ ! -d .gpu ]; then
    say "no .gpu folder here: run python -m bench.gpu_prepare first and carry .gpu"
    echo '{"name": "gpu", "error": "no .gpu folder: carry it"}' > "$OUT/gpu.json"
    exit 2
fi
if [ -z "${GPU_NO_WHEELS:-}" ]; then
    # One failed wheel must not stop the run: the stages that need it record the import error.
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .gpu/wheels/*.whl 2>&1 | tee -a "$LOG" || say "warning: the wheels did not all install into $SITE"
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OUT
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 | tee -a "$LOG" || true
fi
status=0
"$PY" -m bench.gpu_run --out "$OUT" "$@" 2>&1 | tee -a "$LOG" || status=$?
if [ ! -f "$OUT/gpu.json" ]; then
    echo "{\"name\": \"gpu\", \"error\": \"bench.gpu_run exited $status before writing gpu.json: see log.txt\"}" \
        > "$OUT/gpu.json"
fi
say "bench/gpu_run.sh: exit $status; in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$status"
