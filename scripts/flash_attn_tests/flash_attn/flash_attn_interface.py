from flashattn.interface import *  # noqa: F401,F403
from flashattn.interface import _get_block_size_n  # noqa: F401

USE_TRITON_ROCM = False
