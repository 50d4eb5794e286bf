"""flash_attn 2.x's public functions, served by flashattn: only for running
flash_attn's own tests (scripts/flash_attn_tests/run.sh), never installed.
flashattn.interface's __all__ is exactly those seven functions."""

from flashattn.interface import *  # noqa: F401,F403
