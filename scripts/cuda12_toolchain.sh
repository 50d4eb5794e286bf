#!/usr/bin/env bash
# Fetches a CUDA 12.4 nvcc toolchain into a user cache, without root, and
# prints the path of its nvcc on the last line of stdout:
#
#   NVCC=$(scripts/cuda12_toolchain.sh | tail -n1)
#   scripts/cuda12_toolchain.sh --selftest     # also check sm_70 HMMA codegen
#   cmake -DCMAKE_CUDA_COMPILER="$NVCC" ...    # or CUDACXX="$NVCC" pip install .
#
# Why: CUDA 13 dropped sm_70 (Volta), so the sm70 family needs a 12.x nvcc.
# NVIDIA's own installers are on no package registry; Debian's non-free
# nvidia-cuda-toolkit (trixie, 12.4.1) is, and so are NVIDIA's cu12 header
# wheels on PyPI. The pieces:
#   nvidia-cuda-toolkit .deb   nvcc, cicc, ptxas, cudafe++, fatbinary, nvlink,
#                              cuobjdump, nvdisasm, crt/*.stub, libdevice
#   nvidia-cuda-dev .deb       libcudart_static.a, libcudadevrt.a, libculibos.a:
#                              934 MB download, 3 MB kept; needed to link (CMake's
#                              CUDA compiler check, CUDA::cudart_static).
#                              FLASHATTN_CUDA12_STATIC=0 skips it (compile only).
#   PyPI nvidia-cuda-nvcc-cu12     crt/ headers, fatbinary_section.h
#   PyPI nvidia-cuda-runtime-cu12  cuda_runtime.h and friends, libcudart.so.12
#   PyPI nvidia-cuda-cccl-cu12     cuda/std, cub, thrust (CuTe needs cuda/std;
#                                  12.4.127 without .post1 lacks extension-less
#                                  headers such as cuda/std/cstdint)
# Needs curl, dpkg-deb, tar, unzip, sha256sum, python3 -m pip, an x86_64 host,
# and the network on the first run only; later runs reuse the cache (delete
# it to refetch). Everything downloaded is pinned by SHA-256.
set -euo pipefail

CACHE=${FLASHATTN_CUDA12_DIR:-$HOME/.cache/flashattn/cuda12}
ROOT=$CACHE/cuda-12.4
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Debian's snapshot archive keeps every version, for when trixie's pool moves on.
SNAPSHOT=https://snapshot.debian.org/archive/debian/20250815T000000Z
POOL=pool/non-free/n/nvidia-cuda-toolkit
STATIC=${FLASHATTN_CUDA12_STATIC:-1}

log() { echo "cuda12_toolchain: $*" >&2; }

# fetch_deb NAME_VERSION SHA256 DIR: download a pinned .deb and verify it.
fetch_deb() {
  local f="$1_amd64.deb" base
  for base in "$MIRROR" "$SNAPSHOT"; do
    if curl -fsSL --retry 3 -o "$3/$f" "$base/$POOL/$f"; then
      echo "$2  $3/$f" | sha256sum -c --quiet - && return 0
    fi
  done
  log "could not fetch $f (see $MIRROR/dists/trixie/non-free/binary-amd64/Packages.xz)"
  return 1
}

install_toolkit() {
  local tmp="$ROOT.tmp" dl="$CACHE/download"
  rm -rf "$tmp" "$dl"; mkdir -p "$tmp"/{bin,include,lib64,nvvm} "$dl/x"

  log "fetching nvidia-cuda-toolkit 12.4.131 (87 MB)"
  fetch_deb nvidia-cuda-toolkit_12.4.131~12.4.1-2 \
    cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319 "$dl"
  dpkg-deb -x "$dl"/nvidia-cuda-toolkit_*.deb "$dl/x"
  # Debian splits the toolkit over /usr/bin and /usr/lib/nvidia-cuda-toolkit;
  # gather it into one CUDA-style tree (bin, include, lib64, nvvm).
  local t="$dl/x/usr/lib/nvidia-cuda-toolkit"
  cp -a "$t/bin/cicc" "$t/bin/crt" "$tmp/bin/"
  cp -a "$t/bin/nvcc" "$tmp/bin/nvcc.real"
  for b in ptxas fatbinary nvlink cudafe++ cuobjdump nvdisasm bin2c cu++filt nvprune; do
    cp -a "$dl/x/usr/bin/$b" "$tmp/bin/"
  done
  cp -a "$t/libdevice" "$tmp/nvvm/"
  # nvcc probes the host compiler on the caller's PATH before it reads its
  # profile, so a wrapper (as Debian's /usr/bin/nvcc) puts the compiler chosen
  # by pick_host_compiler first. nvcc.real still reads bin/nvcc.profile.
  printf '%s\n' '#!/bin/sh' \
    'd=$(dirname "$(readlink -f "$0")")' \
    '[ -d "$d/../hostcc" ] && PATH="$d/../hostcc:$PATH" && export PATH' \
    'exec "$d/nvcc.real" "$@"' > "$tmp/bin/nvcc"
  chmod +x "$tmp/bin/nvcc"

  log "fetching nvidia-cuda-{nvcc,runtime,cccl}-cu12 wheels from PyPI"
  printf '%s\n' \
    'nvidia-cuda-nvcc-cu12==12.4.131 --hash=sha256:e4c9a35435c3b0e36c6397c5696334c9ea6650e524736cbd1c5d345ea099bb04' \
    'nvidia-cuda-runtime-cu12==12.4.127 --hash=sha256:64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5' \
    'nvidia-cuda-cccl-cu12==12.4.127.post1 --hash=sha256:2027fa5fc75fbee703bf24e8275a40a605cf94a3e8fef8a7187897d49b34facb' \
    > "$dl/req.txt"
  python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes \
    --platform manylinux2014_x86_64 -r "$dl/req.txt" -d "$dl/whl" >&2
  for w in "$dl"/whl/*.whl; do unzip -qo "$w" -d "$dl/w"; done
  cp -a "$dl"/w/nvidia/{cuda_nvcc,cuda_runtime,cuda_cccl}/include/. "$tmp/include/"
  find "$tmp/include" -name __init__.py -delete
  cp -a "$dl/w/nvidia/cuda_runtime/lib/libcudart.so.12" "$tmp/lib64/"
  ln -s libcudart.so.12 "$tmp/lib64/libcudart.so"

  if [ "$STATIC" = 1 ]; then
    log "fetching nvidia-cuda-dev 12.4.127 (934 MB) for the static runtime libraries"
    fetch_deb nvidia-cuda-dev_12.4.127~12.4.1-2 \
      d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0 "$dl"
    local l=./usr/lib/x86_64-linux-gnu
    dpkg-deb --fsys-tarfile "$dl"/nvidia-cuda-dev_*.deb | tar -x -C "$dl/x" \
      "$l/libcudart_static.a" "$l/libcudadevrt.a" "$l/libculibos.a"
    cp -a "$dl/x/$l"/*.a "$tmp/lib64/"
  fi

  echo "12.4.131 static=$STATIC" > "$tmp/.complete"
  rm -rf "$ROOT" "$dl"; mv "$tmp" "$ROOT"   # never leave a half-built tree
}

# nvcc reads bin/nvcc.profile (the .deb's points at /usr/lib paths); this one
# is relative to nvcc's own directory, so the tree works wherever it lies.
write_profile() {
  cat > "$ROOT/bin/nvcc.profile" <<EOF
TOP                = \$(_HERE_)/..
NVVMIR_LIBRARY_DIR = \$(TOP)/nvvm/libdevice
PATH              += \$(_HERE_):
INCLUDES          += "-I\$(TOP)/include" $1 \$(_SPACE_)
LIBRARIES          =+ \$(_SPACE_) "-L\$(TOP)/lib64"
EOF
}

# CUDA 12.4's crt/host_config.h rejects gcc > 13. Use the default g++ when it
# is <= 13 (Debian 12 has 12, Ubuntu 24.04 has 13); else the newest of
# g++-13..g++-9 installed (linked as hostcc/g++ and hostcc/gcc, which the nvcc
# wrapper puts first on PATH); else keep the new g++ and define
# __NV_NO_HOST_COMPILER_CHECK=1, which is what -allow-unsupported-compiler
# does (best effort: newer glibc/libstdc++ headers may still clash).
# FLASHATTN_CUDA12_HOSTCXX=/path/to/g++ forces a compiler; an explicit
# nvcc -ccbin overrides all of this. Redone on every run, so a changed
# system compiler is picked up.
pick_host_compiler() {
  local cxx=${FLASHATTN_CUDA12_HOSTCXX:-} v c
  rm -rf "$ROOT/hostcc"
  if [ -z "$cxx" ]; then
    v=$(g++ -dumpversion 2>/dev/null || echo 0); v=${v%%.*}
    if [ "$v" -le 13 ]; then log "host compiler: g++ $v"; write_profile ""; return; fi
    for c in g++-13 g++-12 g++-11 g++-10 g++-9; do
      if command -v "$c" >/dev/null; then cxx=$(command -v "$c"); break; fi
    done
  fi
  if [ -n "$cxx" ]; then
    mkdir "$ROOT/hostcc"; ln -s "$cxx" "$ROOT/hostcc/g++"; ln -s "$cxx" "$ROOT/hostcc/gcc"
    log "host compiler: $cxx"; write_profile ""
  else
    log "host compiler: g++ $v is newer than CUDA 12.4 supports; allowing it anyway"
    write_profile "-D__NV_NO_HOST_COMPILER_CHECK=1"
  fi
}

# One Volta mma.sync through CuTe's SM70 atom; the SASS must hold HMMA.884.
selftest() {
  local inc d rc=0
  inc=${CUTLASS_INCLUDE_DIR:-$(python3 -c "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source', 'include'))")}
  d=$(mktemp -d)
  cat > "$d/t.cu" <<'EOF'
#include <cute/tensor.hpp>
using namespace cute;
__global__ void hmma884(half_t const* A, half_t const* B, float* C) {
  TiledMMA mma = make_tiled_mma(SM70_8x8x4_F32F16F16F32_TN{});
  Tensor gA = make_tensor(make_gmem_ptr(A), make_layout(make_shape(Int<8>{}, Int<4>{}), LayoutRight{}));
  Tensor gB = make_tensor(make_gmem_ptr(B), make_layout(make_shape(Int<8>{}, Int<4>{}), LayoutRight{}));
  Tensor gC = make_tensor(make_gmem_ptr(C), make_layout(make_shape(Int<8>{}, Int<8>{}), LayoutRight{}));
  auto thr = mma.get_slice(threadIdx.x);
  Tensor rA = thr.partition_fragment_A(gA); copy(thr.partition_A(gA), rA);
  Tensor rB = thr.partition_fragment_B(gB); copy(thr.partition_B(gB), rB);
  Tensor rC = thr.partition_fragment_C(gC); clear(rC);
  gemm(mma, rA, rB, rC);
  copy(rC, thr.partition_C(gC));
}
EOF
  if "$ROOT/bin/nvcc" -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_70,code=sm_70 \
       -Xptxas -v -I"$inc" -c "$d/t.cu" -o "$d/t.o" >&2 &&
     "$ROOT/bin/cuobjdump" -sass "$d/t.o" | grep -q 'HMMA\.884'; then
    echo "selftest: PASS (sm_70 SASS has HMMA.884)"
  else
    echo "selftest: FAIL"; rc=1
  fi
  rm -rf "$d"; return $rc
}

# Reuse the cache unless it is missing, or lacks the static libraries asked for.
if [ -f "$ROOT/.complete" ] && { [ "$STATIC" != 1 ] || grep -q static=1 "$ROOT/.complete"; }; then
  log "using cached $ROOT"
else
  install_toolkit
fi
pick_host_compiler
if [ "${1:-}" = --selftest ]; then selftest; fi
echo "$ROOT/bin/nvcc"
