#!/usr/bin/env bash
# Tests a built wheel on a CUDA machine as a user gets it: installs it (not the
# source tree) into the current Python, runs `python -m flashattn`, times the first
# calls of a kernel from its machine code and from its PTX (compiled by the driver,
# with the driver's cache off), then the GPU suite against the
# installed package (scripts/gpu_suite.sh with FLASHATTN_INSTALLED=1; RUN_SUITE=0
# leaves it out).
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

# First calls: a module from machine code, then one the driver compiles from PTX.
# The cu13 wheel holds the 99 KB tiles for sm_86/89/120 and as PTX compute_80 for
# the rest: on an H100/H200, FLASHATTN_MAX_SMEM_KB=99 sends a d256 forward and a
# d128 backward to them, so their first calls time the driver's compilation of one
# instantiation file's module (CUDA_CACHE_DISABLE=1: no compiled copy from before).
# (CUDA_FORCE_PTX_JIT=1 cannot do this: torch's own kernels have no PTX.)
first_calls='
import os, time, torch
t0 = time.perf_counter(); import flashattn; t1 = time.perf_counter()
d_fwd, d_bwd = (256, 128) if os.environ.get("FLASHATTN_MAX_SMEM_KB") else (128, 128)
def qkv(d):
    return torch.randn(2, 1024, 16, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
qf, qb = qkv(d_fwd), qkv(d_bwd)
torch.cuda.synchronize()
def timed(fn):
    t = time.perf_counter(); r = fn(); torch.cuda.synchronize(); return r, time.perf_counter() - t
_, first = timed(lambda: flashattn.flash_attn_func(qf, qf, qf, causal=True))
_, second = timed(lambda: flashattn.flash_attn_func(qf, qf, qf, causal=True))
out = flashattn.flash_attn_func(qb, qb, qb, causal=True)
_, backward = timed(lambda: out.sum().backward())
out = flashattn.flash_attn_func(qb, qb, qb, causal=True)
_, backward2 = timed(lambda: out.sum().backward())
print(f"import flashattn {t1 - t0:.3f} s; d{d_fwd} forward: first {first:.3f} s, second {second * 1e3:.2f} ms;"
      f" d{d_bwd} backward: first {backward:.3f} s, second {backward2 * 1e3:.2f} ms")
'
echo "machine code:" | tee "$LOG_DIR/first-calls.txt"
(cd /tmp && CUDA_CACHE_DISABLE=1 $PY -c "$first_calls") 2>&1 | tee -a "$LOG_DIR/first-calls.txt"
echo "99 KB tiles (PTX compute_80 on sm_90, compiled by the driver):" | tee -a "$LOG_DIR/first-calls.txt"
(cd /tmp && FLASHATTN_MAX_SMEM_KB=99 CUDA_CACHE_DISABLE=1 $PY -c "$first_calls") 2>&1 | tee -a "$LOG_DIR/first-calls.txt"

if [ "${RUN_SUITE:-1}" = 1 ]; then
  FLASHATTN_INSTALLED=1 LOG_DIR="$LOG_DIR" bash scripts/gpu_suite.sh || status=1
fi
exit $status
