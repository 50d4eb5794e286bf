#!/usr/bin/env bash
# Builds a release wheel: flashattn-<version>+cu13 (or +cu12)-py3-none-manylinux_2_28_x86_64.whl.
#
#   scripts/build_wheel.sh cu13     # nvcc 13.x: families sm75 (sm_75) and sm80
#                                   # (sm_80/86/89/90/100/120 + PTX compute_90)
#   scripts/build_wheel.sh cu12     # nvcc 12.x: sm70 (sm_70) too; sm_100/120 from 12.8 on
#
# The release workflow (.github/workflows/wheels.yml) runs exactly this. Needs
# torch >= 2.11 (a CPU build is enough: headers and libtorch_cpu), the build
# requirements (requirements-build.txt) and `wheel` (python3 -m pip install wheel).
# Environment:
#   CUDACXX        nvcc to use (default: cu13 /usr/local/cuda/bin/nvcc; cu12 the
#                  CUDA 12.4 nvcc scripts/cuda12_toolchain.sh fetches)
#   OUT            where the wheel goes (default dist/)
#   JOBS           parallel compile jobs (default: the number of cores)
#   FLASHATTN_HEAD_DIMS, FLASHATTN_DTYPES   prune (a trial build; the check says so)
# Steps: build (pip wheel --no-build-isolation) with the release target lists
# (FLASHATTN_CUDA_ARCHS=release) against glibc 2.27 headers and libraries where
# the host's glibc is newer than 2.28 (scripts/glibc_sysroot.sh) and the C++
# runtime linked in privately; retag linux_x86_64 -> manylinux_2_28_x86_64; then
# scripts/check_wheel.py: the glibc versions the module needs fit the tag, it
# needs no other shared library than torch's and the C runtime's, exports no C++
# runtime symbol, and holds the families and targets of its CUDA major; it prints
# the wheel's size, build time and kernel count.
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:?usage: scripts/build_wheel.sh cu13|cu12}
case $variant in
  cu13) want_major=13 ;;
  cu12) want_major=12 ;;
  *) echo "unknown variant '$variant' (cu13 or cu12)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
OUT=${OUT:-dist}
MANYLINUX=manylinux_2_28   # the glibc the wheel may need, at most (PEP 600)
log() { echo "build_wheel: $*" >&2; }

if [ -z "${CUDACXX:-}" ]; then
  if [ "$variant" = cu13 ]; then
    CUDACXX=/usr/local/cuda/bin/nvcc
  else
    CUDACXX=$(scripts/cuda12_toolchain.sh | tail -n1)
  fi
fi
export CUDACXX
nvcc_version=$("$CUDACXX" --version | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p')
if [ "${nvcc_version%%.*}" != "$want_major" ]; then
  log "$CUDACXX is CUDA $nvcc_version; the $variant wheel needs a CUDA $want_major.x nvcc (set CUDACXX)"
  exit 2
fi
$PY -m wheel version > /dev/null 2>&1 || { log "needs the wheel package: $PY -m pip install wheel"; exit 2; }

# glibc: the module may need no newer symbol versions than the tag allows. On a
# newer host, compile and link against glibc 2.27 (gcc --sysroot). The module's
# own link line (CMAKE_MODULE_LINKER_FLAGS) also takes the C++ runtime statically;
# CMakeLists.txt keeps its symbols private (--exclude-libs).
host_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
link_flags="-static-libstdc++"
if [ "$(printf '%s\n2.28\n' "$host_glibc" | sort -V | tail -n1)" != 2.28 ]; then
  sysroot=$(scripts/glibc_sysroot.sh | tail -n1)
  log "host glibc $host_glibc > 2.28: building against $sysroot"
  # The host's C++ headers were configured for its own glibc: their
  # <bits/c++config.h> turns on wrappers of pthread functions that glibc 2.30
  # added. A copy with those three off, first on the include path, describes
  # the glibc the module is built against.
  cxx_config=$(echo '#include <bits/c++config.h>' | "${CXX:-g++}" -E -x c++ - |
               sed -n 's|^# 1 "\(/[^"]*bits/c++config.h\)".*|\1|p' | head -n1)
  overlay="$PWD/build/release-$variant-cxx"
  mkdir -p "$overlay/bits"
  sed -E 's|^#define (_GLIBCXX_USE_PTHREAD_(COND_CLOCKWAIT\|MUTEX_CLOCKLOCK\|RWLOCK_CLOCKLOCK)) 1|/* \1: needs glibc 2.30 */|' \
    "$cxx_config" > "$overlay/c++config.h.new"
  # Replaced only when it changes: every object depends on it.
  cmp -s "$overlay/c++config.h.new" "$overlay/bits/c++config.h" || mv "$overlay/c++config.h.new" "$overlay/bits/c++config.h"
  export CXXFLAGS="${CXXFLAGS:-} --sysroot=$sysroot -isystem $overlay"
  export CUDAFLAGS="${CUDAFLAGS:-} -Xcompiler=--sysroot=$sysroot -isystem $overlay"
  link_flags="$link_flags --sysroot=$sysroot -L$sysroot/usr/lib/x86_64-linux-gnu -L$sysroot/lib/x86_64-linux-gnu"
else
  log "host glibc $host_glibc: building natively"
fi

export FLASHATTN_WHEEL_CUDA=$variant FLASHATTN_CUDA_ARCHS=release FLASHATTN_FAMILIES=
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "building the $variant wheel with $CUDACXX (CUDA $nvcc_version), $CMAKE_BUILD_PARALLEL_LEVEL jobs"
start=$(date +%s)
$PY -m pip wheel --no-build-isolation --no-deps -v -w "$tmp" \
  -Cbuild-dir="build/release-$variant" \
  -Ccmake.define.CMAKE_MODULE_LINKER_FLAGS="$link_flags" . 2>&1 | tee "$tmp/build.log" | grep -E "flashattn:|Successfully|rror" >&2
build_s=$(( $(date +%s) - start ))
built=$(ls "$tmp"/flashattn-*-linux_x86_64.whl)
$PY -m wheel tags --remove --platform-tag "${MANYLINUX}_x86_64" "$built" > /dev/null
whl=$(ls "$tmp"/flashattn-*-"${MANYLINUX}"_x86_64.whl)
mv "$whl" "$OUT/"
whl="$OUT/$(basename "$whl")"
log "built $whl in ${build_s} s"
$PY scripts/check_wheel.py "$whl" --variant "$variant" --build-seconds "$build_s" --jobs "$CMAKE_BUILD_PARALLEL_LEVEL"
