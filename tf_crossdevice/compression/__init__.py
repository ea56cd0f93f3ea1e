"""Gradient compression: the 16-bit wire codec, its error bound and when it
pays, and PowerSGD's low-rank compression with error feedback.

May import: `_core`.
"""

from tf_crossdevice.compression._codec import (
    COMPRESSIONS,
    compresses,
    gather_compression_pays,
    sum_tolerance,
)
from tf_crossdevice.compression._powersgd import PowerSGD

__all__ = [
    "COMPRESSIONS",
    "PowerSGD",
    "compresses",
    "gather_compression_pays",
    "sum_tolerance",
]
