#!/usr/bin/env bash
# Tests a built wheel on a CUDA machine as a user gets it: installs it (not the
# source tree) into the current Python, runs `python -m flashattn`, times the first
# calls of a kernel from its machine code and from its PTX (compiled by the driver,
# CUDA_FORCE_PTX_JIT=1, with the driver's cache off), then the GPU suite against the
# installed package (scripts/gpu_suite.sh with FLASHATTN_INSTALLED=1).
#
#   LOG_DIR=logs bash scripts/test_wheel_gpu.sh dist/flashattn-0.1.0+cu13-py3-none-manylinux_2_28_x86_64.whl
set -uo pipefail
cd "$(dirname "$0")/.."
wheel=${1:?usage: scripts/test_wheel_gpu.sh WHEEL}
PY=${PYTHON:-python3}
LOG_DIR=${LOG_DIR:-gpu-logs}
mkdir -p "$LOG_DIR"
status=0

$PY -m pip install -q --no-deps --force-reinstall "$wheel" || exit 1
# Run from outside the checkout, so that nothing imports the source tree.
(cd /tmp && $PY -m flashattn) 2>&1 | tee "$LOG_DIR/selfcheck.txt" || status=1

first_calls='
import time, torch
t0 = time.perf_counter(); import flashattn; t1 = time.perf_counter()
q = torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
torch.cuda.synchronize()
def timed(fn):
    t = time.perf_counter(); r = fn(); torch.cuda.synchronize(); return r, time.perf_counter() - t
out, first = timed(lambda: flashattn.flash_attn_func(q, q, q, causal=True))
_, second = timed(lambda: flashattn.flash_attn_func(q, q, q, causal=True))
_, backward = timed(lambda: out.sum().backward())
print(f"import flashattn {t1 - t0:.3f} s; first forward {first:.3f} s, second {second * 1e3:.2f} ms,"
      f" first backward {backward:.3f} s")
'
echo "machine code:" | tee "$LOG_DIR/first-calls.txt"
(cd /tmp && CUDA_CACHE_DISABLE=1 $PY -c "$first_calls") 2>&1 | tee -a "$LOG_DIR/first-calls.txt"
echo "PTX compiled by the driver (CUDA_FORCE_PTX_JIT=1):" | tee -a "$LOG_DIR/first-calls.txt"
(cd /tmp && CUDA_FORCE_PTX_JIT=1 CUDA_CACHE_DISABLE=1 $PY -c "$first_calls") 2>&1 | tee -a "$LOG_DIR/first-calls.txt"

FLASHATTN_INSTALLED=1 LOG_DIR="$LOG_DIR" bash scripts/gpu_suite.sh || status=1
exit $status
