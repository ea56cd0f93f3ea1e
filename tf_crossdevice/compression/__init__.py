"""16-bit wire compression: the codec, its error bound, and when it pays.

May import: `_core`.
"""

from tf_crossdevice.compression._codec import (
    COMPRESSIONS,
    compresses,
    gather_compression_pays,
    sum_tolerance,
)

__all__ = [
    "COMPRESSIONS",
    "compresses",
    "gather_compression_pays",
    "sum_tolerance",
]
