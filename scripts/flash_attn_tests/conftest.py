"""Runs flash_attn 2.x's tests/test_flash_attn.py against flashattn (run.sh sets it up).

The grid is over 500,000 tests; FLASH_ATTN_TESTS_SAMPLE keeps a deterministic
sample: a test stays when crc32(FLASH_ATTN_TESTS_SALT + its id) is 0 modulo its
function's divisor ("test_flash_attn_output=300,default=1"; 0 deselects a
function). FLASH_ATTN_TESTS_FAILURES names a file that gets each failure as it
happens, so a run cut short still says what failed.
"""

import os
import zlib

import torch

if not torch.cuda.is_available():  # the test module asks for a capability at import: collection only
    torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)


def pytest_collection_modifyitems(config, items):
    spec = os.environ.get("FLASH_ATTN_TESTS_SAMPLE", "default=1")
    divisors = dict(entry.split("=") for entry in spec.split(",") if entry)
    default = int(divisors.get("default", 1))
    salt = os.environ.get("FLASH_ATTN_TESTS_SALT", "")
    keep, drop = [], []
    for item in items:
        n = int(divisors.get(item.originalname or item.name, default))
        sampled = n > 0 and zlib.crc32((salt + item.nodeid).encode()) % n == 0
        (keep if sampled else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


def pytest_runtest_logreport(report):
    path = os.environ.get("FLASH_ATTN_TESTS_FAILURES")
    if path and report.failed:
        errors = [line for line in report.longreprtext.splitlines() if line.startswith("E ")][:3]
        with open(path, "a") as f:
            f.write(f"FAILED {report.nodeid} ({report.when}): {' | '.join(errors)[:400]}\n")
