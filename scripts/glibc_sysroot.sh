#!/usr/bin/env bash
# Fetches a glibc 2.27 sysroot (Ubuntu 18.04's libc6, libc6-dev, linux-libc-dev)
# into a user cache, without root, and prints its path on the last line of stdout:
#
#   SYSROOT=$(scripts/glibc_sysroot.sh | tail -n1)
#
# Why: a module links against the glibc of the machine that builds it, and then
# needs that glibc's symbol versions to load (built on Debian 12: GLIBC_2.34 for
# dlopen and the pthread functions; on Ubuntu 24.04: GLIBC_2.38). A manylinux_2_28
# wheel may need at most GLIBC_2.28. Compiling and linking against this sysroot's
# headers and libraries (gcc --sysroot, scripts/build_wheel.sh) gives a module that
# needs at most GLIBC_2.27, with the host's compiler. The C++ runtime is linked
# statically and kept private, so no GLIBCXX_ version is needed either.
# The release workflow builds in the manylinux_2_28 container instead, whose own
# glibc is 2.28; scripts/build_wheel.sh uses this sysroot only on newer hosts.
# Needs curl, dpkg-deb, sha256sum and the network on the first run only; later
# runs reuse the cache (delete it to refetch). Every package is pinned by SHA-256.
set -euo pipefail

CACHE=${FLASHATTN_SYSROOT_DIR:-$HOME/.cache/flashattn}
ROOT=$CACHE/sysroot-glibc-2.27
MIRROR=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}

log() { echo "glibc_sysroot: $*" >&2; }

# fetch POOL_PATH SHA256 DIR: download a pinned .deb and verify it.
fetch_deb() {
  local f
  f=$(basename "$1")
  curl -fsSL --retry 3 -o "$3/$f" "$MIRROR/$1" || { log "could not fetch $MIRROR/$1"; return 1; }
  echo "$2  $3/$f" | sha256sum -c --quiet -
}

install_sysroot() {
  local tmp="$ROOT.tmp" l t
  rm -rf "$tmp"; mkdir -p "$tmp/download"
  log "fetching glibc 2.27 (Ubuntu 18.04: libc6, libc6-dev, linux-libc-dev; 6 MB)"
  fetch_deb pool/main/g/glibc/libc6_2.27-3ubuntu1.6_amd64.deb \
    5b813d4512491cd8fb30b2eb9192349ee75ffe3c9f21ae136cc7b2429f70c3b2 "$tmp/download"
  fetch_deb pool/main/g/glibc/libc6-dev_2.27-3ubuntu1.6_amd64.deb \
    96ae7d2cf38f0547ca3cccb3344c8802fdf5bcd71c4b6d9aed09558ac8cc87db "$tmp/download"
  fetch_deb pool/main/l/linux/linux-libc-dev_4.15.0-213.224_amd64.deb \
    06d9f16644d3a1b2ab7dd01730e833d516b6f575d975855f496eea6463fef2f6 "$tmp/download"
  for d in "$tmp"/download/*.deb; do dpkg-deb -x "$d" "$tmp"; done
  rm -rf "$tmp/download"
  # The packages' absolute symlinks (libdl.so -> /lib/...) would point at the
  # host's libraries: make them relative, inside the sysroot.
  while IFS= read -r l; do
    t=$(readlink "$l")
    ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" "$tmp$t")" "$l"
  done < <(find "$tmp" -type l -lname '/*')
  echo "glibc 2.27-3ubuntu1.6" > "$tmp/.complete"
  rm -rf "$ROOT"; mv "$tmp" "$ROOT"   # never leave a half-built tree
}

if [ -f "$ROOT/.complete" ]; then
  log "using cached $ROOT"
else
  install_sysroot
fi
echo "$ROOT"
