#!/usr/bin/env bash
# Runs the GPU suite on a CUDA machine and writes logs to $LOG_DIR.
#   bash scripts/gpu_suite.sh              build every family for the local GPU's
#                                          arch (pip install .), then test
#   FLASHATTN_PREBUILT=1 bash scripts/...  use the extension already placed in
#                                          python/flashattn/ (built elsewhere)
#   FLASHATTN_INSTALLED=1 bash scripts/... test the flashattn installed in the
#                                          Python (e.g. a release wheel), not the tree
# Extra pytest arguments go in PYTEST_ARGS (e.g. "--slow" for the full grid).
# SMEM99_SUITE=1 runs the suite a second time under FLASHATTN_MAX_SMEM_KB=99.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${LOG_DIR:-gpu-logs}
mkdir -p "$LOG_DIR"
PY=${PYTHON:-python3}

if [ -n "${FLASHATTN_INSTALLED:-}" ]; then
  :  # tests/conftest.py imports the installed package before the source tree
elif [ -z "${FLASHATTN_PREBUILT:-}" ]; then
  # Every family for this GPU's arch, so one GPU tests every code path.
  export FLASHATTN_FAMILIES=${FLASHATTN_FAMILIES:-all}
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  $PY -m pip install --no-build-isolation --no-deps -v . 2>&1 | tee "$LOG_DIR/build.log"
else
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
fi

nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv | tee "$LOG_DIR/device.txt"
$PY -c "import torch, json, flashattn; print(torch.__version__, torch.version.cuda, flashattn.__file__); print(json.dumps(flashattn.build_info(), indent=1))" \
  | tee -a "$LOG_DIR/device.txt"
set +e
$PY -m pytest -q -m gpu -rs tests ${PYTEST_ARGS:-} 2>&1 | tee "$LOG_DIR/pytest.log"
status=${PIPESTATUS[0]}
echo "gpu suite exit status: $status" | tee -a "$LOG_DIR/pytest.log"
if [ -n "${SMEM99_SUITE:-}" ]; then
  # Again with every launch capped at 99 KB of shared memory: the tiles of
  # cc 8.6/8.9 GPUs (A10, L4, L40S, RTX 3090/4090) on this GPU.
  FLASHATTN_MAX_SMEM_KB=99 $PY -m pytest -q -m gpu -rs tests ${PYTEST_ARGS:-} 2>&1 \
    | tee "$LOG_DIR/pytest-smem99.log"
  s99=${PIPESTATUS[0]}
  echo "gpu suite (FLASHATTN_MAX_SMEM_KB=99) exit status: $s99" | tee -a "$LOG_DIR/pytest-smem99.log"
  [ "$status" -eq 0 ] && status=$s99
fi
exit "$status"
