"""Kernel-family dispatch with mocked device capabilities and build infos; build_info()."""

import json

import flashattn
import pytest
import torch
from flashattn import FlashAttnError, _dispatch
from flashattn._dispatch import (
    family_for_capability,
    head_dim_bucket,
    resolve_family,
    runs_on,
)
from torch._subclasses.fake_tensor import FakeTensorMode


def build(families, cuda="12.9", dtypes=("fp16", "bf16"), head_dims=(32, 64, 96, 128, 256)):
    """A build_info() dict for a build holding ``families``."""
    return {
        "version": "0.1.0",
        "cuda_version": cuda,
        "torch_target_version": "2.11",
        "families": families,
        "dtypes": list(dtypes),
        "head_dims": list(head_dims),
        "extension_loaded": True,
        "extension_error": None,
        "torch_version": torch.__version__,
    }


# What release wheels hold (DESIGN.md): each family for the targets it serves.
CUDA12_RELEASE = build(
    {
        "sm70": {"sass": [70], "ptx": []},
        "sm75": {"sass": [75], "ptx": []},
        "sm80": {"sass": [80, 90], "ptx": [90]},
    }
)
CUDA13_RELEASE = build(
    {
        "sm75": {"sass": [75], "ptx": []},
        "sm80": {"sass": [80, 90, 100, 120], "ptx": [120]},
    },
    cuda="13.0",
)
# A development build: every family compiled for one Hopper target.
HOPPER_DEV = build({f: {"sass": [90], "ptx": []} for f in ("sm70", "sm75", "sm80")}, cuda="13.0")

DEVICES = {
    (7, 0): "Tesla V100-SXM2-16GB",
    (7, 5): "Tesla T4",
    (8, 0): "NVIDIA A100-SXM4-80GB",
    (9, 0): "NVIDIA H100 80GB HBM3",
}


def resolve(capability, dtype=torch.float16, family=None, info=CUDA12_RELEASE, environ=None):
    return resolve_family(
        torch.device("cuda"),
        dtype,
        family,
        capability=capability,
        device_name=DEVICES.get(capability, "some GPU"),
        info=info,
        environ=environ or {},
    )


def raises(fn, *fragments):
    with pytest.raises(FlashAttnError) as info:
        fn()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in {str(info.value)!r}"
    return str(info.value)


@pytest.mark.parametrize(
    "capability, family",
    [
        ((7, 0), 70),
        ((7, 2), 70),
        ((7, 5), 75),
        ((8, 0), 80),
        ((8, 6), 80),
        ((8, 9), 80),
        ((9, 0), 90),
        ((10, 0), 80),  # sm_90a code (wgmma) does not run there
        ((12, 0), 80),
    ],
)
def test_capability_to_family(capability, family):
    assert family_for_capability(capability, "gpu") == family


def test_too_old_gpu():
    raises(
        lambda: family_for_capability((6, 1), "NVIDIA GeForce GTX 1080"),
        "flashattn needs compute capability 7.0 or newer; NVIDIA GeForce GTX 1080 is 6.1",
    )


@pytest.mark.parametrize(
    "targets, cc, ok",
    [
        ({"sass": [80, 90], "ptx": [90]}, 80, True),
        ({"sass": [80, 90], "ptx": [90]}, 86, True),  # sm_80 code runs on 8.6 and 8.9
        ({"sass": [80, 90], "ptx": [90]}, 89, True),
        ({"sass": [80, 90], "ptx": [90]}, 100, True),  # through the compute_90 PTX
        ({"sass": [80, 90], "ptx": [90]}, 75, False),
        ({"sass": [80], "ptx": []}, 90, False),  # machine code does not cross majors
        ({"sass": [86], "ptx": []}, 80, False),  # nor run on an older minor
        ({"sass": [90], "ptx": []}, 75, False),
        ({"sass": [], "ptx": [75]}, 80, True),
        ({"sass": [], "ptx": [75]}, 70, False),
        ({"sass": [90], "ptx": [], "arch_specific": True}, 90, True),  # sm_90a: 9.0 alone
        ({"sass": [90], "ptx": [], "arch_specific": True}, 100, False),
    ],
)
def test_runs_on(targets, cc, ok):
    assert runs_on(targets, cc) is ok


@pytest.mark.parametrize(
    "capability, family", [((7, 0), 70), ((7, 5), 75), ((8, 0), 80), ((8, 6), 80), ((9, 0), 80)]
)
def test_release_build_picks_the_newest_family(capability, family):
    assert resolve(capability) == family


@pytest.mark.parametrize("capability", [(7, 0), (7, 5)])
def test_bf16_needs_sm80(capability):
    raises(
        lambda: resolve(capability, torch.bfloat16),
        "bf16 needs sm_80 tensor cores",
        "fp16",
        ".half()",
    )


def test_bf16_on_a_forced_old_family():
    raises(
        lambda: resolve((9, 0), torch.bfloat16, family="sm75", info=HOPPER_DEV),
        "the forced family sm75 takes fp16 only",
    )


@pytest.mark.parametrize("value, family", [("sm70", 70), ("75", 75), (80, 80), ("SM75", 75)])
def test_forced_family_argument(value, family):
    assert resolve((9, 0), family=value, info=HOPPER_DEV) == family


def test_forced_family_environment():
    assert resolve((9, 0), info=HOPPER_DEV, environ={"FLASHATTN_FAMILY": "sm70"}) == 70
    assert resolve((9, 0), info=HOPPER_DEV, environ={"FLASHATTN_FAMILY": "auto"}) == 80
    assert resolve((9, 0), info=HOPPER_DEV, environ={"FLASHATTN_FAMILY": ""}) == 80
    # the argument wins over the environment
    assert resolve((9, 0), family=75, info=HOPPER_DEV, environ={"FLASHATTN_FAMILY": "70"}) == 75
    raises(
        lambda: resolve((9, 0), environ={"FLASHATTN_FAMILY": "hopper"}),
        "FLASHATTN_FAMILY='hopper' is not a kernel family",
    )


def test_forced_family_newer_than_the_device():
    raises(
        lambda: resolve((7, 5), family="sm80"),
        "family sm80 needs compute capability 8.0 or newer; Tesla T4 is 7.5",
        "newest family is sm75",
    )


def test_forced_family_not_built():
    msg = raises(
        lambda: resolve((9, 0), family="sm75", info=CUDA13_RELEASE),
        "no family sm75 in this build runs on NVIDIA H100 80GB HBM3",
        "FLASHATTN_FAMILIES",
        "FLASHATTN_CUDA_ARCHS",
        "FLASHATTN_FAMILY",
    )
    # it lists what was built: families x targets
    assert "sm80 (sass sm_80, sm_90, sm_100, sm_120; ptx compute_120)" in msg
    assert "sm75 (sass sm_75; ptx none)" in msg


def test_forced_family_built_for_another_target():
    # the dev build's sm75 family is machine code for sm_90 only: not for an A100
    raises(
        lambda: resolve((8, 0), family="sm75", info=HOPPER_DEV),
        "no family sm75 in this build runs on NVIDIA A100",
        "sm75 (sass sm_90; ptx none)",
    )


def test_cuda13_build_on_volta_points_to_the_cuda12_wheel():
    for family in (None, "sm70"):
        raises(
            lambda family=family: resolve((7, 0), family=family, info=CUDA13_RELEASE),
            "this build has no sm70 family (CUDA 13 cannot target sm_70)",
            "install the CUDA 12 wheel",
        )


def test_cuda13_build_serves_newer_gpus_through_ptx():
    assert resolve((12, 1), info=CUDA13_RELEASE) == 80
    assert resolve((7, 5), info=CUDA13_RELEASE) == 75


def test_auto_falls_back_to_an_older_built_family():
    only_sm75 = build({"sm75": {"sass": [90], "ptx": []}})
    assert resolve((9, 0), info=only_sm75) == 75
    raises(
        lambda: resolve((9, 0), torch.bfloat16, info=only_sm75),
        "no kernel family in this build runs on NVIDIA H100",
    )


def test_dtype_not_built():
    raises(
        lambda: resolve(
            (9, 0), torch.bfloat16, info=build(CUDA12_RELEASE["families"], dtypes=["fp16"])
        ),
        "this build has no bf16 kernels (built: fp16)",
        "FLASHATTN_DTYPES",
    )


def test_extension_not_loaded():
    info = dict(build({}), extension_loaded=False, extension_error="undefined symbol: foo")
    raises(
        lambda: resolve((9, 0), info=info), "CUDA extension is not loaded", "undefined symbol: foo"
    )


# A release of the CUDA 13 toolchain with the Hopper family (sm_90a machine code).
WITH_SM90 = build(dict(CUDA13_RELEASE["families"], sm90={"sass": [90], "ptx": [], "arch_specific": True}),
                  cuda="13.0")


def test_hopper_runs_the_sm90_family_where_built():
    assert resolve((9, 0), info=WITH_SM90) == 90
    assert resolve((9, 0), torch.bfloat16, info=WITH_SM90) == 90
    assert resolve((9, 0), family="sm80", info=WITH_SM90) == 80  # still forceable
    assert resolve((9, 0), info=CUDA13_RELEASE) == 80  # a build without it
    assert resolve((10, 0), info=WITH_SM90) == 80
    assert resolve((12, 0), info=WITH_SM90) == 80
    raises(
        lambda: resolve((10, 0), family="sm90", info=WITH_SM90),
        "family sm90 runs on compute capability 9.0 only",
        "its newest family is sm80",
    )


def test_build_without_families_trusts_the_kernels():
    assert resolve((9, 0), info=build({})) == 80
    assert resolve((9, 0), family="sm70", info=build({})) == 70


def test_head_dim_buckets():
    buckets = [32, 64, 96, 128, 160, 192, 224, 256]
    assert head_dim_bucket(8, buckets) == 32
    assert head_dim_bucket(40, buckets) == 64
    assert head_dim_bucket(256, buckets) == 256
    assert head_dim_bucket(96, [64, 128]) == 128
    assert head_dim_bucket(200, []) is None  # nothing recorded: the kernels check
    raises(
        lambda: head_dim_bucket(168, [64, 128]),
        "head dim 168 needs a kernel bucket >= 168",
        "head dims are 64, 128",
        "FLASHATTN_HEAD_DIMS including 192",
    )


def test_device_capability_is_read_from_the_device(monkeypatch):
    monkeypatch.setattr(_dispatch, "device_capability", lambda device: ((7, 5), "Tesla T4"))
    assert (
        resolve_family(torch.device("cuda"), torch.float16, info=CUDA12_RELEASE, environ={}) == 75
    )


def _mock_gpu(monkeypatch, capability, info):
    monkeypatch.setattr(
        _dispatch, "device_capability", lambda device: (capability, DEVICES[capability])
    )
    monkeypatch.setattr(_dispatch, "build_info", lambda: info)
    monkeypatch.delenv("FLASHATTN_FAMILY", raising=False)
    # A private cache for the test: mocked answers must not outlive it.
    monkeypatch.setattr(_dispatch, "_dispatch_cache", {})


def test_dispatch_is_a_constant_under_torch_compile(monkeypatch):
    _mock_gpu(monkeypatch, (7, 5), CUDA12_RELEASE)

    @torch.compile(fullgraph=True, backend="eager")
    def fn(x):
        family, head_dims = _dispatch.cuda_family_and_head_dims(
            torch.device("cuda"), torch.float16, None
        )
        return x * family + len(head_dims)

    assert fn(torch.ones(2)).tolist() == [80.0, 80.0]  # 75 + 5 buckets


def test_public_api_dispatches_cuda_inputs(monkeypatch):
    # Fake CUDA tensors run the public API's CUDA path (checks, dispatch, fake kernels).
    _mock_gpu(monkeypatch, (7, 5), build(CUDA12_RELEASE["families"], head_dims=(64, 128)))
    with FakeTensorMode():
        q, k, v = (torch.empty(2, 9, 4, 40, dtype=torch.float16, device="cuda") for _ in range(3))
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        assert out.shape == q.shape and out.device.type == "cuda"
        raises(
            lambda: flashattn.flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16()),
            "bf16 needs sm_80 tensor cores",
        )
        raises(
            lambda: flashattn.flash_attn_func(q, k, v, family="sm80"),
            "family sm80 needs compute capability 8.0",
        )
        big = torch.empty(2, 9, 4, 200, dtype=torch.float16, device="cuda")
        raises(
            lambda: flashattn.flash_attn_func(big, big, big),
            "head dim 200 needs a kernel bucket",
            "FLASHATTN_HEAD_DIMS including 224",
        )


# ---- build_info()


def test_build_info_without_a_build(monkeypatch, tmp_path):
    monkeypatch.setattr(_dispatch, "_BUILD_INFO_PATH", str(tmp_path / "_build_info.json"))
    info = flashattn.build_info()
    assert info["families"] == {} and info["dtypes"] == [] and info["head_dims"] == []
    assert info["version"] is None and info["cuda_version"] is None
    assert info["torch_version"] == torch.__version__
    assert isinstance(info["extension_loaded"], bool)
    assert info["extension_error"] is None or isinstance(info["extension_error"], str)


def test_build_info_from_the_build(monkeypatch, tmp_path):
    written = {
        "version": "0.1.0",
        "cuda_version": "13.0",
        "torch_target_version": "2.11",
        "families": {"sm80": {"sass": [80, 90], "ptx": [90]}, "sm75": {"sass": [90], "ptx": []}},
        "dtypes": ["fp16", "bf16"],
        "head_dims": [32, 64, 96, 128, 160, 192, 224, 256],
    }
    path = tmp_path / "_build_info.json"
    path.write_text(json.dumps(written))
    monkeypatch.setattr(_dispatch, "_BUILD_INFO_PATH", str(path))
    info = flashattn.build_info()
    assert {k: info[k] for k in written} == written
    assert set(info) == set(written) | {"extension_loaded", "extension_error", "torch_version"}
    info["families"].clear()  # callers get a copy
    assert flashattn.build_info()["families"] == written["families"]


def test_build_info_unreadable(monkeypatch, tmp_path):
    path = tmp_path / "_build_info.json"
    path.write_text("{not json")
    monkeypatch.setattr(_dispatch, "_BUILD_INFO_PATH", str(path))
    raises(flashattn.build_info, "cannot read the build info", "reinstall or rebuild")
