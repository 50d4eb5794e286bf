import os
import re
import sys

import pytest
import torch

try:  # an installed flashattn takes precedence over the source tree
    import flashattn
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import flashattn  # noqa: F401

from _gpu import gpu_skip_reason
from hypothesis import settings

# Modest example counts: the whole CPU suite should stay within a few minutes on 2 cores.
settings.register_profile("flashattn", max_examples=25, deadline=None)
settings.load_profile("flashattn")


def pytest_addoption(parser):
    parser.addoption(
        "--slow", action="store_true", default=False, help="also run tests marked slow"
    )


def pytest_collection_modifyitems(config, items):
    run_slow = config.getoption("--slow")
    gpu_reason = gpu_skip_reason() if any("gpu" in item.keywords for item in items) else None
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow test: run pytest with --slow"))
        if "gpu" in item.keywords and gpu_reason:
            item.add_marker(pytest.mark.skip(reason=gpu_reason))


# A build pruned to some dtypes (FLASHATTN_DTYPES) refuses the others by name. A test
# that calls the public functions in such a dtype skips, as call_kernel skips a
# missing kernel; only where the build info really lacks that dtype.
_DTYPE_NOT_BUILT = re.compile(r"this build has no (fp16|bf16) kernels")
# The same for what the machine cannot serve: a build with no family for this GPU, or
# bf16 where the GPU's family (or the one FLASHATTN_FAMILY forces) takes fp16 only
# (a V100 or T4, or an H200 running the sm70/sm75 family).
_FAMILY_NOT_BUILT = re.compile(r"no (kernel family|family sm\d+) in this build runs on")
_BF16_UNSERVED = "bf16 needs sm_80 tensor cores"


def _environment_takes_fp16_only() -> bool:
    from flashattn import _dispatch, _families

    forced = _dispatch.parse_family(os.environ.get("FLASHATTN_FAMILY"), "FLASHATTN_FAMILY")
    if forced is None:
        capability, name = _dispatch.device_capability(torch.device("cuda"))
        forced = _dispatch.family_for_capability(capability, name)
    return not _families.get(forced).bf16


def _skip_reason(message: str) -> str | None:
    m = _DTYPE_NOT_BUILT.search(message)
    if m and m.group(1) not in flashattn.build_info().get("dtypes", []):
        return f"this build has no {m.group(1)} kernels"
    if _FAMILY_NOT_BUILT.search(message):
        return message.split(" — ")[0]
    if _BF16_UNSERVED in message and torch.cuda.is_available() and _environment_takes_fp16_only():
        return message.split(" — ")[0]
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    if outcome.excinfo is None:
        return
    reason = _skip_reason(str(outcome.excinfo[1]))
    if reason:
        outcome.force_exception(pytest.skip.Exception(reason))
