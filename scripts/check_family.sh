#!/usr/bin/env bash
# Compiles every instantiation of the sm70 or sm75 family for its real target
# (sm_70 / sm_75), of the sm80 family for sm_86, or of the sm90 family for sm_90a,
# and checks what a V100 / T4 / 99 KB Ampere-Ada GPU / H100 would run, without the GPU:
#   - the machine code uses the family's tensor-core instruction
#     (sm70: HMMA.884, sm75: HMMA.1688, sm90: HGMMA); for sm90 also that the
#     forward's setmaxnreg took effect (USETMAXREG) and that no wgmma fell back to a trap
#     (BPT.TRAP: code built for plain sm_90),
#   - no kernel stores spilled registers to local memory inside its main loop
#     (scripts/sass_spills.py; ptxas's spill counts are printed too),
#   - no kernel needs more shared memory than the GPU gives a CTA
#     (V100: 96 KB, T4: 64 KB, sm_86/sm_89: 99 KB).
# Prints registers, shared memory and spills per kernel (scripts/resource_report.py).
#
#   scripts/check_family.sh sm75     # nvcc from $NVCC or /usr/local/cuda (12.x or 13.x)
#   scripts/check_family.sh sm80     # the sm80 family for sm_86 with the tiles that fit
#                                    # 99 KB (what an A10 / L4 / RTX 3090 / 4090 runs)
#   scripts/check_family.sh sm90     # the sm90 family (forward and backward) for sm_90a
#   scripts/check_family.sh sm70     # needs a CUDA 12.x nvcc: $NVCC, or fetched by
#                                    # scripts/cuda12_toolchain.sh (CUDA 13 has no sm_70)
# Head dims: FLASHATTN_HEAD_DIMS (default all eight buckets); passes: FLASHATTN_PASSES
# (default "fwd bwd"). Jobs: $JOBS (default nproc). Extra compile definitions (an
# experiment's switches, docs/developing.md): FLASHATTN_DEFINES, e.g.
#   FLASHATTN_DEFINES="-DFLASHATTN_SM90_Q_STAGES=1" FLASHATTN_PASSES=fwd scripts/check_family.sh sm90
set -euo pipefail
cd "$(dirname "$0")/.."
family=${1:?usage: scripts/check_family.sh sm70|sm75|sm80|sm90}
passes=${FLASHATTN_PASSES:-fwd bwd}
defines="${FLASHATTN_DEFINES:-}"
case $family in
  sm70) arch=70 smem_kb=96 hmma=HMMA.884 ;;
  sm75) arch=75 smem_kb=64 hmma=HMMA.1688 ;;
  sm80) arch=86 smem_kb=99 hmma=HMMA.16816 ;;  # the tiles of 99 KB GPUs (A10, L4, RTX 30xx/40xx)
  # As CMakeLists.txt builds it: sm_90a, the extended wgmma shapes, release asserts off.
  sm90) arch=90a smem_kb=227 hmma=HGMMA defines+=" -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DNDEBUG" ;;
  *) echo "unknown family '$family' (sm70, sm75, sm80 or sm90)" >&2; exit 2 ;;
esac
if [ -z "${NVCC:-}" ]; then
  if [ "$family" = sm70 ]; then
    NVCC=$(FLASHATTN_CUDA12_STATIC=0 scripts/cuda12_toolchain.sh | tail -n1)
  else
    NVCC=/usr/local/cuda/bin/nvcc
  fi
fi
CUOBJDUMP=$(dirname "$NVCC")/cuobjdump
[ -x "$CUOBJDUMP" ] || CUOBJDUMP=$(command -v cuobjdump) || { echo "no cuobjdump next to $NVCC or on PATH" >&2; exit 2; }
CUTE=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One file per pass and head dim, as CMakeLists.txt generates them; for sm80 on
# sm_86, the tile a 99 KB GPU runs (the kSmem99 set where it has one).
Fam=Sm${family#sm}
for d in ${FLASHATTN_HEAD_DIMS:-32 64 96 128 160 192 224 256}; do
  for pass in $passes; do
    Pass=${pass^}
    cat > "$work/${pass}_$d.cu" <<EOF
#include "flashattn/launch/${pass}_${family}.h"
namespace flashattn {
using Small = ${Fam}${Pass}<cutlass::half_t, $d, TileSet::kSmem99>;
using Kernel = std::conditional_t<Small::kBuilt, Small, ${Fam}${Pass}<cutlass::half_t, $d, TileSet::kDefault>>;
void ${pass}_${family}_hd$d(const ${Pass}Params& p, cudaStream_t s) { launch_${pass}<Kernel>(p, s); }
}
EOF
  done
done
echo "$family: compiling $(ls "$work"/*.cu | wc -l) files for sm_$arch with $("$NVCC" --version | tail -n1)"
start=$(date +%s)
ls "$work"/*.cu | xargs -P "${JOBS:-$(nproc)}" -I{} sh -c \
  "'$NVCC' -c {} -o {}.o -I include -I '$CUTE' -O3 --use_fast_math --expt-relaxed-constexpr -std=c++17 \
   $defines -gencode arch=compute_$arch,code=sm_$arch -Xptxas=-v > {}.log 2>&1 || { cat {}.log; exit 255; }"
echo "compiled in $(( $(date +%s) - start )) s"
cat "$work"/*.log > "$work/all.log"

status=0
for obj in "$work"/*.o; do
  "$CUOBJDUMP" -sass "$obj" > "$obj.sass"
  if ! grep -q "$hmma" "$obj.sass"; then
    echo "FAIL: $(basename "$obj" .cu.o) has no $hmma in its sm_$arch code" >&2
    status=1
  fi
  if [ "$family" = sm90 ]; then
    if grep -q "BPT.TRAP" "$obj.sass"; then
      echo "FAIL: $(basename "$obj" .cu.o) has BPT.TRAP (an instruction its target lacks)" >&2
      status=1
    fi
    # The warp-specialised forward reallocates registers (the backward has no producer).
    if [[ $(basename "$obj") == fwd_* ]] && ! grep -q "USETMAXREG" "$obj.sass"; then
      echo "FAIL: $(basename "$obj" .cu.o) has no USETMAXREG (setmaxnreg ignored)" >&2
      status=1
    fi
  fi
done
[ $status -eq 0 ] && echo "every file's sm_$arch code uses $hmma"
python3 scripts/resource_report.py "$work/all.log" --max-smem-kb "$smem_kb" || status=1
# Spills: none may be stored inside a main loop (ptxas counts above include the
# prologue and epilogue; this looks at where the local-memory accesses are).
cat "$work"/*.sass | python3 scripts/sass_spills.py || status=1
exit $status
