#!/usr/bin/env bash
# The project's one prepared GPU run, for a machine like the one lent here: one H200, torch 2.11,
# triton 3.6, no network, one call of at most 10 minutes. It finishes within LIMIT_S (540 s),
# install included: each step has its own budget, printed up front, and a step that would end past
# the limit is skipped, not started. Each step writes its results to $OUT as it finishes, so a
# kill loses only the step in flight. $OUT keeps at most 8 flat files (what the device tool brings
# back): device_check.log, steps.tsv, gpu-check-*.json, decode-schedules.json, tune-quick.json,
# mlactl-home.tgz (tuned configs and the measured profile), compile-sm90.json.
#
#   bash benchmarks/device_check.sh             # on the GPU machine (OUT defaults to ./device-out)
#   bash benchmarks/device_check.sh --dry-run   # here, on a CPU: checks the plan and every import
#
# What to read first in the results: docs/kernels.md, "The first GPU run".
set -euo pipefail

LIMIT_S=${DEVICE_CHECK_LIMIT_S:-540}
# step:budget in seconds, in the order they run (most telling first); together they must leave a
# margin under LIMIT_S for the shell itself. (DEVICE_CHECK_STEPS replaces them: the tests' short run.)
read -r -a STEPS <<<"${DEVICE_CHECK_STEPS:-setup:45 gpu_check:170 tests:100 schedules:80 tune:75 compile:40}"

DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "$DRY" = 0 ]; then  # outside $OUT, which brings back 8 files at most; archived after tune
  export MLACTL_HOME=${MLACTL_HOME:-$(mktemp -d "${TMPDIR:-/tmp}/mlactl-home.XXXXXX")}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout is what runs, installed or not
export PY=${PYTHON:-python3}
START=$(date +%s)

total=0
echo "device_check: plan (limit ${LIMIT_S} s, OUT=$OUT, MLACTL_HOME=${MLACTL_HOME:-unset})"
for s in "${STEPS[@]}"; do
  printf '  %-10s %4d s\n' "${s%%:*}" "${s##*:}"
  total=$((total + ${s##*:}))
done
printf '  %-10s %4d s (margin %d s)\n' total "$total" $((LIMIT_S - total))
if [ "$total" -gt "$LIMIT_S" ]; then
  echo "device_check: the step budgets add up to ${total} s, over the ${LIMIT_S} s limit" >&2
  exit 1
fi

budget_of() {
  local s
  for s in "${STEPS[@]}"; do
    if [ "${s%%:*}" = "$1" ]; then echo "${s##*:}"; return; fi
  done
  echo "device_check: no budget for step $1" >&2
  return 1
}

if [ "$DRY" = 1 ]; then
  # no GPU, nothing installed or written but a scratch $OUT: the plan, the tools, every import
  command -v timeout >/dev/null || { echo "dry run: 'timeout' is missing" >&2; exit 1; }
  "$PY" - <<'EOF'
import importlib
for name in ("mlactl.cli", "mlactl.cli.tune", "mlactl.kernels.decode", "mlactl.kernels.prefill",
             "mlactl.kernels.merge", "mlactl.kernels.attention", "mlactl.tune.compile", "mlactl.tune.sweep",
             "mlactl.tune.timing", "mlactl.model.hardware", "torch", "triton"):
    importlib.import_module(name)
import mlactl, os
assert os.path.realpath(mlactl.__file__).startswith(os.path.realpath(os.getcwd())), mlactl.__file__
print("dry run: imports ok from", os.path.dirname(mlactl.__file__))
EOF
  "$PY" benchmarks/gpu_check.py --help >/dev/null
  "$PY" benchmarks/bench_decode_schedules.py --help >/dev/null
  "$PY" -m mlactl.cli tune --help >/dev/null
  "$PY" -m mlactl.cli tune compile --help >/dev/null
  "$PY" -m pytest --collect-only -q -m gpu tests >/dev/null
  for s in "${STEPS[@]}"; do budget_of "${s%%:*}" >/dev/null; done
  echo "dry run: plan, tools and imports ok (7 result files planned, at most 8 come back)"
  exit 0
fi

exec > >(tee -a "$OUT/device_check.log") 2>&1
printf 'step\tstatus\tseconds\tbudget\n' >"$OUT/steps.tsv"

# run_step NAME CMD...: run CMD under its budget unless it could end past the limit; record it
run_step() {
  local name=$1 budget rc t0
  shift
  budget=$(budget_of "$name")
  t0=$(date +%s)
  if [ $((t0 - START + budget)) -gt "$LIMIT_S" ]; then
    echo "== $name: skipped (${budget} s would end past ${LIMIT_S} s; $((t0 - START)) s used)"
    printf '%s\tskipped\t0\t%s\n' "$name" "$budget" >>"$OUT/steps.tsv"
    return 0
  fi
  echo "== $name (budget ${budget} s, at $((t0 - START)) s)"
  if timeout -k 5 "$budget" "$@"; then rc=0; else rc=$?; fi
  local status
  case "$rc" in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status="failed($rc)" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" $(($(date +%s) - t0)) "$budget" >>"$OUT/steps.tsv"
  echo "== $name: $status in $(($(date +%s) - t0)) s"
  return 0
}

setup() {
  set -uo pipefail  # a fresh bash (run_step runs it under timeout): pip's status, not tail's
  # setuptools there may lack `wheel`: then pip cannot build the editable install, and the
  # source tree on PYTHONPATH (set above) is what runs; `python3 -m mlactl.cli` stands in for mlactl
  if timeout 30 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -n 3; then
    echo "setup: pip install -e . done"
  else
    echo "setup: pip could not install; running from the source tree on PYTHONPATH"
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
  "$PY" -c "import torch, triton, numpy, mlactl; print('torch', torch.__version__, 'triton', triton.__version__, \
'numpy', numpy.__version__, torch.cuda.get_device_name(), 'mlactl from', mlactl.__file__)"
}

export -f setup  # run_step runs commands under `timeout`, which needs a program: bash -c setup

archive_home() {
  tar -C "$MLACTL_HOME" -czf "$OUT/mlactl-home.tgz" . 2>/dev/null || true
}

run_step setup bash -c setup
run_step gpu_check "$PY" benchmarks/gpu_check.py --skip-tests --out "$OUT" --bench-budget 135
run_step tests "$PY" -m pytest -m gpu -q -p no:cacheprovider tests
run_step schedules "$PY" benchmarks/bench_decode_schedules.py --quick --out "$OUT" --budget 65
run_step tune "$PY" -m mlactl.cli tune --quick --budget 60 --results-file "$OUT/tune-quick.json"
archive_home
run_step compile "$PY" -m mlactl.cli tune compile -f json -o "$OUT/compile-sm90.json"

echo "device_check: done in $(($(date +%s) - START)) s"
cat "$OUT/steps.tsv"
ls -la "$OUT"
