#!/usr/bin/env bash
# The project's one prepared GPU run (benchmarks/device_check.py says what it runs, in what budget):
# this wrapper only picks the python, keeps the full log in $OUT and passes its arguments on.
#
#   bash benchmarks/device_check.sh             # on the GPU machine (OUT defaults to ./device-out)
#   bash benchmarks/device_check.sh --dry-run   # here, on a CPU: the plan, every budget, the tools
#
# How to run it and read what it writes: docs/gpu-check.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
export PYTHON=$PY PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout is what runs, installed or not
case "${1:-}" in
  --dry-run) exec "$PY" benchmarks/device_check.py --dry-run ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export OUT
"$PY" benchmarks/device_check.py --out "$OUT" 2>&1 | tee -a "$OUT/device_check.log"
exit "${PIPESTATUS[0]}"
