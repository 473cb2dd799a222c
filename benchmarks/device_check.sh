#!/usr/bin/env bash
# The project's one prepared GPU run (about 8 minutes on one H200): install, the GPU tests and
# the kernel benchmark (gpu_check.py), then `mlactl tune --quick`. Everything it writes goes
# into $OUT (default ./device-out) as at most 8 flat files, ready to commit into
# benchmarks/results/ (tuned configs ship only once measured: see kernels/configs.py).
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MLACTL_HOME="$OUT/home"

python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -n 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/nvidia-smi.csv" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

timeout 270 python3 benchmarks/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
# old (uniform splits) and new (balanced plan) decode side by side, each checked against the twin
timeout 150 python3 benchmarks/bench_decode_schedules.py --quick --out "$OUT" 2>&1 | tee "$OUT/schedules.log"
timeout 200 python3 -m mlactl.cli tune --quick --results-file "$OUT/tune-quick.json" 2>&1 | tee "$OUT/tune.log"

# tuned configs and the measured profile, as one file (the transfer keeps only flat files)
tar -C "$MLACTL_HOME" -czf "$OUT/mlactl-home.tgz" tuned hardware 2>/dev/null
rm -rf "$MLACTL_HOME"
ls -la "$OUT"
