#!/usr/bin/env bash
# The checks that need the accelerator machine (one GPU, 16 cores), as one command that fits one device call:
# the runtime against Open MPI at 2-16 ranks on real cores, and the GPU operator tables beside the compute
# model's predictions. Writes everything under OUT (default $OUT, else ./device-out).
#
#     bash benchmarks/device_check.sh [OUT]
set -u
out="${1:-${OUT:-device-out}}"
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
nproc >"$out/machine.txt"; lscpu >>"$out/machine.txt" 2>&1; nvidia-smi >>"$out/machine.txt" 2>&1
timeout 240 python3 benchmarks/gpu_operators.py --out "$out" --compile 2>&1 | tee "$out/gpu_operators.txt"
timeout 330 python3 benchmarks/compare_baselines.py --nranks 2,4,8,16 --sizes 8B,64KiB,1MiB,64MiB --rounds 3 \
    --no-gloo --json "$out/runtime.json" --plot "$out/runtime.png" 2>&1 | tee "$out/runtime.txt"
