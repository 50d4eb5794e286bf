"""The kernel families, read from families.json (the one list; CMakeLists.txt reads it too).

A family is a kernel code path named after the oldest GPU it serves (sm80: Ampere's
instruction set). Numbers are compute capabilities as 10 * major + minor.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    number: int  # 70, 75, 80, 90
    min_cc: int  # the oldest compute capability it runs on
    arch_specific: str | None  # "90a": machine code for min_cc alone, no PTX
    bf16: bool
    backward: int  # the family whose backward serves this forward
    smem99_tiles: bool
    dropout_row_pairing: int
    dropout_lane_units: bool
    gpus: str

    @property
    def name(self) -> str:
        return f"sm{self.number}"

    def runs_on(self, cc: int) -> bool:
        """Can this family's code run on a GPU of capability cc (10 * major + minor)?"""
        return cc == self.min_cc if self.arch_specific else cc >= self.min_cc


def _load() -> dict[int, Family]:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "families.json")
    with open(path) as f:
        entries = json.load(f)["families"]
    families = {}
    for name, e in entries.items():
        number = int(name.removeprefix("sm"))
        families[number] = Family(
            number=number,
            min_cc=e["min_cc"],
            arch_specific=e["arch_specific"],
            bf16=e["bf16"],
            backward=int(e["backward"].removeprefix("sm")),
            smem99_tiles=e["smem99_tiles"],
            dropout_row_pairing=e["dropout_row_pairing"],
            dropout_lane_units=e["dropout_lane_units"],
            gpus=e["gpus"],
        )
    return dict(sorted(families.items()))


_FAMILIES = _load()
FAMILIES: tuple[int, ...] = tuple(_FAMILIES)  # ascending
NAMES: tuple[str, ...] = tuple(f.name for f in _FAMILIES.values())


def get(number: int) -> Family:
    return _FAMILIES[number]


def newest_for(cc: int) -> int | None:
    """The newest family that runs on capability cc; None below every family."""
    runnable = [n for n, f in _FAMILIES.items() if f.runs_on(cc)]
    return max(runnable) if runnable else None


def newest_portable(cc: int) -> int | None:
    """The newest family for cc whose code is not arch-specific (what a build that
    records no families runs)."""
    runnable = [n for n, f in _FAMILIES.items() if f.runs_on(cc) and not f.arch_specific]
    return max(runnable) if runnable else None


def bf16_families() -> tuple[int, ...]:
    return tuple(n for n, f in _FAMILIES.items() if f.bf16)


def listing(numbers: bool = False) -> str:
    """"sm70, sm75, sm80, sm90" (or "70, 75, 80, 90")."""
    return ", ".join(str(n) if numbers else f"sm{n}" for n in FAMILIES)
