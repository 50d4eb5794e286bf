"""flash_attn 2.x's public functions, served by flashattn: only for running
flash_attn's own tests (scripts/flash_attn_tests/run.sh), never installed."""

from flashattn import (  # noqa: F401
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
