#!/usr/bin/env bash
# Forward tile sweep of the sm90 family on a Hopper GPU: builds one extension per
# tile of the warp-specialised forward (M = 64 per consumer warpgroup; bf16, the
# buckets that tile suits), in parallel, then times each beside SDPA's backends in
# one run. Writes $OUT_DIR/sweep.txt.
#   VARIANTS="base:64,128,256 64x128:64,128 ..." bash benchmarks/sweep_sm90_tiles.sh
# A variant NAME:DIMS:FLAGS adds compile definitions (comma-separated) to any tile
# (NAME MxN) or to the committed tiles (any other NAME), e.g.
#   VARIANTS="base:64,128 q1:64,128:-DFLASHATTN_SM90_Q_STAGES=1 128x128:64"
# Lengths that are not multiples of the tile (SEQLENS=500,1000) exercise the
# warpgroups that lie past a sequence's end; every cell's output is checked
# against SDPA's. DROPOUT=0.1 times every variant with dropout (outputs are then
# not compared: the masks differ; run the dropout GPU tests on the variant).
# SWEEP_DIR (default /tmp) holds each variant's build, sweep-NAME/pkg/flashattn;
# BUILD_ONLY=1 builds and stops, PREBUILT=1 times what SWEEP_DIR already holds (build
# on one machine, time on another).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-/tmp/sweep}
mkdir -p "$OUT_DIR"
VARIANTS=${VARIANTS:-"base:64,128,256 64x128:64,128 128x96:64,128 128x64:128,256 64x64:256"}
SEQLENS=${SEQLENS:-1k,8k}
SWEEP_DIR=${SWEEP_DIR:-/tmp}
JOBS=${JOBS:-4}
build() {  # name dims [flags, comma-separated]
  local name=$1 dims=$2 dir=$SWEEP_DIR/sweep-$1 flags="${3//,/ }"
  if [[ $name =~ ^[0-9]+x[0-9]+$ ]]; then flags+=" -DFLASHATTN_SM90_TILE_M=${name%x*} -DFLASHATTN_SM90_TILE_N=${name#*x}"; fi
  rm -rf "$dir"; mkdir -p "$dir/pkg"
  CUDAFLAGS="$flags" cmake -S . -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHS=90 \
    -DFLASHATTN_FAMILIES=sm90 -DFLASHATTN_DTYPES=bf16 "-DFLASHATTN_HEAD_DIMS=${dims//,/;}" > "$dir/cmake.log" 2>&1 &&
    ninja -C "$dir/build" -j "$JOBS" _C > "$dir/build.log" 2>&1 &&
    cp -r python/flashattn "$dir/pkg/" && cp "$dir/build/_C.so" "$dir/build/_build_info.json" "$dir/pkg/flashattn/" &&
    echo "built $name" || { echo "FAILED $name"; tail -20 "$dir/build.log"; }
}
if [ "${PREBUILT:-0}" != 1 ]; then
  start=$(date +%s)
  for v in $VARIANTS; do IFS=: read -r name dims flags <<< "$v"; build "$name" "$dims" "$flags" & done
  wait
  echo "builds: $(( $(date +%s) - start )) s" | tee "$OUT_DIR/sweep.txt"
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
first=1
for v in $VARIANTS; do
  IFS=: read -r name dims flags <<< "$v"
  [ -f "$SWEEP_DIR/sweep-$name/pkg/flashattn/_C.so" ] || continue
  # FA2 runs beside every variant: its output is the reference each cell is checked against.
  impls=flashattn,FA2; [ $first = 1 ] && impls=flashattn,FA2,cuDNN; first=0
  echo "== tile $name (hdims $dims${flags:+, $flags})" | tee -a "$OUT_DIR/sweep.txt"
  PYTHONPATH=$SWEEP_DIR/sweep-$name/pkg python3 benchmarks/bench_attention.py --mode fwd --dtype bf16 --hdim "$dims" \
    --seqlen "$SEQLENS" --family sm90 --impls $impls --out "$OUT_DIR/$name" --no-plot ${DROPOUT:+--dropout $DROPOUT} 2>&1 \
    | grep -E "^fwd|overall|hdim|WARNING" | tee -a "$OUT_DIR/sweep.txt"
done
