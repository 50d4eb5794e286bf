"""flashattn: FlashAttention (exact attention, forward and backward) for PyTorch.

Drop-in for the flash_attn 2.x functions; the raw ops are ``torch.ops.flashattn.*``
(docs/ops.md). Without the compiled extension the ops run on CPU tensors through the
pure-PyTorch ``reference``.
"""

from . import (
    _ops,  # noqa: F401 - defines and registers torch.ops.flashattn.*
    bert_padding,
    reference,
)
from ._checks import FlashAttnError
from ._dispatch import build_info
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = "0.1.0"

__all__ = [
    "FlashAttnError",
    "__version__",
    "bert_padding",
    "build_info",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "reference",
]
