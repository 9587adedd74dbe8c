#!/usr/bin/env bash
# The checks that need the accelerator machine (one GPU, 16 cores), as one command that fits one device call:
# the GPU operator tables beside the compute model's predictions ("gpu"), and the runtime against Open MPI at
# 2-16 ranks on real cores with the per-call overhead breakdown ("runtime"). Every part writes under OUT
# (default $OUT, else ./device-out) as it finishes, so a part cut short by its timeout leaves the others.
#
#     bash benchmarks/device_check.sh [OUT] [gpu|runtime|all]
set -u
out="${1:-${OUT:-device-out}}"
what="${2:-all}"
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
nproc >"$out/machine.txt"; lscpu >>"$out/machine.txt" 2>&1; nvidia-smi >>"$out/machine.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >>"$out/machine.txt" 2>&1
if [ "$what" = gpu ] || [ "$what" = all ]; then
    timeout 150 python3 benchmarks/gpu_tables.py --out "$out" 2>&1 | tee "$out/gpu_tables.txt"
    timeout 200 python3 benchmarks/gpu_operators.py --out "$out" --compile 2>&1 | tee "$out/gpu_operators.txt"
fi
if [ "$what" = runtime ] || [ "$what" = all ]; then
    for n in 2,4 8 16; do
        tcp=""; [ "$n" = "2,4" ] || tcp="--no-tcp"
        timeout 150 python3 benchmarks/compare_baselines.py --nranks "$n" --sizes 8B,64KiB,1MiB,64MiB --rounds 3 \
            --no-gloo $tcp --json "$out/runtime-$n.json" --plot "$out/runtime-$n.png" 2>&1 | tee "$out/runtime-$n.txt"
    done
    # small calls under both argument-check patterns (pairs: the default; log: RINGFLOW_CHECK_ROUNDS=log)
    timeout 150 python3 benchmarks/compare_baselines.py --nranks 4,8,16 --sizes 8B,64KiB --rounds 3 --log-rounds \
        --no-gloo --no-tcp --json "$out/runtime-log.json" 2>&1 | tee "$out/runtime-log.txt"
    RINGFLOW_FLIGHT_RECORDER=0 timeout 60 python3 benchmarks/call_overhead.py --nranks 2,4,8,16 --parts \
        --json "$out/overhead.json" 2>&1 | tee "$out/overhead.txt"
    # two runs: --breakdown alone returns before the per-call table
    timeout 40 python3 benchmarks/torch_backend.py --per-call -o "$out/torch_per_call.json" 2>&1 \
        | tee "$out/torch_per_call.txt"
    timeout 20 python3 benchmarks/torch_backend.py --breakdown 2>&1 | tee "$out/torch_breakdown.txt"
fi
