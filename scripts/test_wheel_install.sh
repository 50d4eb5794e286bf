#!/usr/bin/env bash
# Installs a built wheel as a user would, into a fresh virtual environment per torch
# version, and checks it there; prints one table row per version.
#
#   scripts/test_wheel_install.sh dist/flashattn-0.1.0+cu13-py3-none-manylinux_2_28_x86_64.whl \
#       [2.11.0 2.13.0 2.15.0]
#
# Per torch version: `pip install torch==V` (from the configured index: PyPI's
# default build, or $TORCH_INDEX_URL; the table says which build came), `pip install
# WHEEL`, then
#   - `import flashattn`: the extension loads (build_info) with the wheel's families;
#   - every op of the schema list has a CUDA kernel registered by the extension;
#   - `python -m flashattn --no-timing`: on a GPU machine the self-test of the CUDA
#     kernels, else the CPU path's forward and backward against torch's attention.
# Run on the GPU machine it also tests the kernels; `scripts/gpu_suite.sh` with
# FLASHATTN_INSTALLED=1 runs the whole GPU suite against the installed wheel.
# The venvs are made under $VENV_ROOT (default a temporary directory), one at a time,
# and removed after their row unless KEEP_VENVS=1. Exit status 1 if any row failed.
set -uo pipefail
cd "$(dirname "$0")/.."
wheel=$(realpath "${1:?usage: scripts/test_wheel_install.sh WHEEL [torch versions...]}")
shift
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.11.0 2.13.0 2.15.0)
PY=${PYTHON:-python3}
root=${VENV_ROOT:-$(mktemp -d)}
mkdir -p "$root"
status=0
printf '| torch | installed | python | install (s) | venv (GB) | extension loaded | CUDA kernels registered | import (s) | self-check |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for v in "${versions[@]}"; do
  venv="$root/torch-$v"
  rm -rf "$venv"
  $PY -m venv "$venv"
  log="$root/torch-$v.log"
  start=$(date +%s)
  if ! { "$venv/bin/python" -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$v" &&
         "$venv/bin/python" -m pip install -q --no-deps "$wheel"; } > "$log" 2>&1; then
    printf '| %s | | - | install failed (%s) | | | | | |\n' "$v" "$(tail -n1 "$log")"
    status=1; continue
  fi
  install_s=$(( $(date +%s) - start ))
  size=$(du -s --block-size=1M "$venv" | awk '{printf "%.1f", $1 / 1024}')
  row=$(cd "$root" && "$venv/bin/python" - "$wheel" 2>>"$log" <<'PY'
import json, re, subprocess, sys, time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter()
import flashattn
from flashattn import _ops
t2 = time.perf_counter()
info = flashattn.build_info()
ops = [re.match(r"(\w+)\(", s).group(1) for s in _ops.SCHEMAS]
cuda = [op for op in ops if torch._C._dispatch_has_kernel_for_dispatch_key(f"flashattn::{op}", "CUDA")]
label = re.search(r"\+(cu\d+)-", sys.argv[1])
ok = info["extension_loaded"] and len(cuda) == len(ops) and flashattn.__version__ == info["version"].split("+")[0]
ok = ok and (label is None or info["version"].endswith("+" + label.group(1)))
check = subprocess.run([sys.executable, "-m", "flashattn", "--no-timing"], capture_output=True, text=True)
sys.stderr.write(check.stdout + check.stderr)
result = check.stdout.strip().splitlines()[-1] if check.stdout.strip() else "no output"
print(json.dumps({
    "python": ".".join(map(str, sys.version_info[:3])),
    "build": f"{torch.__version__}, " + (f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"),
    "loaded": info["extension_loaded"] or info["extension_error"],
    "cuda": f"{len(cuda)}/{len(ops)}",
    "import_s": round(t2 - t1, 2),
    "check": result,
    "ok": bool(ok and check.returncode == 0),
}))
PY
)
  if [ -z "$row" ]; then
    printf '| %s | | - | %s | %s | import failed (%s) | | | |\n' "$v" "$install_s" "$size" "$(tail -n1 "$log")"
    status=1
  else
    echo "$row" | $PY -c "
import json, sys
r = json.loads(sys.stdin.read())
print(f\"| $v | {r['build']} | {r['python']} | $install_s | $size | {r['loaded']} | {r['cuda']} | {r['import_s']} | {r['check']} |\")
sys.exit(0 if r['ok'] else 1)" || status=1
  fi
  [ "${KEEP_VENVS:-0}" = 1 ] || rm -rf "$venv"
done
echo "logs: $root" >&2
exit $status
