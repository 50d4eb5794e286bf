#!/usr/bin/env bash
# Forward tile sweep of the sm90 family on a Hopper GPU: builds one extension per
# tile of the warp-specialised forward (M = 64 per consumer warpgroup; bf16, the
# buckets that tile suits), in parallel, then times each beside SDPA's backends in
# one run. Writes $OUT_DIR/sweep.txt.
#   VARIANTS="base:64,128,256 64x128:64,128 ..." bash benchmarks/sweep_sm90_tiles.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-/tmp/sweep}
mkdir -p "$OUT_DIR"
VARIANTS=${VARIANTS:-"base:64,128,256 64x128:64,128 128x96:64,128 128x64:128,256 64x64:256"}
SEQLENS=${SEQLENS:-1k,8k}
build() {  # name dims
  local name=$1 dims=$2 dir=/tmp/sweep-$1 flags=""
  if [ "$name" != base ]; then flags="-DFLASHATTN_SM90_TILE_M=${name%x*} -DFLASHATTN_SM90_TILE_N=${name#*x}"; fi
  rm -rf "$dir"; mkdir -p "$dir/pkg"
  CUDAFLAGS="$flags" cmake -S . -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHS=90 \
    -DFLASHATTN_FAMILIES=sm90 -DFLASHATTN_DTYPES=bf16 "-DFLASHATTN_HEAD_DIMS=${dims//,/;}" > "$dir/cmake.log" 2>&1 &&
    ninja -C "$dir/build" -j 4 _C > "$dir/build.log" 2>&1 &&
    cp -r python/flashattn "$dir/pkg/" && cp "$dir/build/_C.so" "$dir/build/_build_info.json" "$dir/pkg/flashattn/" &&
    echo "built $name" || { echo "FAILED $name"; tail -20 "$dir/build.log"; }
}
start=$(date +%s)
for v in $VARIANTS; do build "${v%%:*}" "${v#*:}" & done
wait
echo "builds: $(( $(date +%s) - start )) s" | tee "$OUT_DIR/sweep.txt"
first=1
for v in $VARIANTS; do
  name=${v%%:*} dims=${v#*:}
  [ -f "/tmp/sweep-$name/pkg/flashattn/_C.so" ] || continue
  impls=flashattn; [ $first = 1 ] && impls=flashattn,FA2,cuDNN; first=0
  echo "== tile $name (hdims $dims)" | tee -a "$OUT_DIR/sweep.txt"
  PYTHONPATH=/tmp/sweep-$name/pkg python3 benchmarks/bench_attention.py --mode fwd --dtype bf16 --hdim "$dims" \
    --seqlen "$SEQLENS" --family sm90 --impls $impls --out "$OUT_DIR/$name" --no-plot 2>&1 \
    | grep -E "^fwd|overall|hdim" | tee -a "$OUT_DIR/sweep.txt"
done
