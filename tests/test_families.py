"""The family registry (python/flashattn/families.json) and what reads it."""

import json
import os

import pytest
from flashattn import _checks, _families

ROOT = os.path.join(os.path.dirname(__file__), "..")
LAUNCH = os.path.join(ROOT, "include", "flashattn", "launch")


def test_every_family_has_its_launch_headers():
    for number in _families.FAMILIES:
        family = _families.get(number)
        assert os.path.exists(os.path.join(LAUNCH, f"fwd_{family.name}.h")), family.name
        backward = _families.get(family.backward)
        assert backward.backward == backward.number, f"{family.name}'s backward family has a backward of its own"
        assert os.path.exists(os.path.join(LAUNCH, f"bwd_{backward.name}.h")), backward.name
        if family.backward == number:
            assert family.number >= backward.number


@pytest.mark.parametrize(
    "cc, newest",
    [(60, None), (70, 70), (72, 70), (75, 75), (80, 80), (86, 80), (87, 80), (89, 80), (90, 90), (100, 80),
     (103, 80), (120, 80)],
)
def test_newest_family_per_capability(cc, newest):
    assert _families.newest_for(cc) == newest


def test_arch_specific_families_run_on_their_capability_only():
    hopper = _families.get(90)
    assert hopper.arch_specific == "90a"
    assert hopper.runs_on(90) and not hopper.runs_on(100) and not hopper.runs_on(89)
    assert _families.newest_portable(90) == 80


def test_the_registry_is_what_the_package_uses():
    assert _checks.FAMILIES == _families.FAMILIES == (70, 75, 80, 90)
    assert _families.NAMES == ("sm70", "sm75", "sm80", "sm90")
    assert _families.bf16_families() == (80, 90)
    assert _families.listing() == "sm70, sm75, sm80, sm90"
    with open(os.path.join(ROOT, "python", "flashattn", "families.json")) as f:
        raw = json.load(f)["families"]
    assert list(raw) == list(_families.NAMES)
    assert [_families.get(n).dropout_row_pairing for n in _families.FAMILIES] == [2, 8, 8, 8]
    assert [_families.get(n).dropout_lane_units for n in _families.FAMILIES] == [False, True, True, True]
