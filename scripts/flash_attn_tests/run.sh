#!/usr/bin/env bash
# flash_attn 2.x's own tests against flashattn, on a CUDA machine:
#   bash scripts/flash_attn_tests/run.sh /path/to/flash-attention [pytest args]
# copies the checkout's tests/test_flash_attn.py beside a `flash_attn` package that
# re-exports flashattn's functions (this folder), and runs it on the flashattn that
# Python imports (PYTHONPATH=python for the source tree with a built extension).
# The full grid is over 500,000 tests: FLASH_ATTN_TESTS_SAMPLE picks a sample
# (conftest.py; the default below is about 1,500 tests, 4-5 minutes on an H100);
# FLASH_ATTN_TESTS_SALT draws another one. Needs einops. Three tests call
# flash_attn's private C++ bindings (`flash_attn_gpu`, `_flash_attn_varlen_forward`)
# and are deselected. Narrow a run with -k (e.g. -k "race_condition and 0.17-1024"): a node id
# in the pytest args adds to the file this script passes, so the whole sample runs.
set -euo pipefail
src=${1:?usage: run.sh /path/to/flash-attention [pytest args]}
shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$here/flash_attn" "$here/conftest.py" "$work/"
cp "$src/tests/test_flash_attn.py" "$work/"
export FLASH_ATTN_TESTS_SAMPLE=${FLASH_ATTN_TESTS_SAMPLE:-"test_flash_attn_output=300,test_flash_attn_varlen_output=300,\
test_flash_attn_kvcache=1000,test_flash_attn_qkvpacked=60,test_flash_attn_varlen_qkvpacked=60,test_flash_attn_causal=16,\
test_flash_attn_varlen_causal=30,test_flash_attn_splitkv=60,test_flash_attn_deterministic=40,\
test_flash_attn_varlen_deterministic=40,test_flash_attn_race_condition=20,test_flash_attn_varlen_paged_kv_num_splits=0,\
test_flash_attn_generator_arg_must_be_none=0,default=1"}
export PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}"
cd "$work"
python3 -m pytest -q -rf --tb=short -p no:cacheprovider test_flash_attn.py "$@"
