"""Gradient compression: the 16-bit wire codec, its error bound and when it
pays, PowerSGD's low-rank compression with error feedback, and the
`WirePolicy` that picks one of them (or neither) for a reduction and says
which links cross workers.
"""

from tf_crossdevice.compression._codec import (
    COMPRESSIONS,
    check_compression,
    compresses,
    decode,
    encode,
    gather_compression_pays,
    sum_tolerance,
)
from tf_crossdevice.compression._powersgd import PowerSGD
from tf_crossdevice.compression._wire_policy import (
    SameWorker,
    Wire,
    WirePolicy,
    check_wire,
    default_same_worker,
)

__all__ = [
    "COMPRESSIONS",
    "PowerSGD",
    "SameWorker",
    "Wire",
    "WirePolicy",
    "check_compression",
    "check_wire",
    "compresses",
    "decode",
    "default_same_worker",
    "encode",
    "gather_compression_pays",
    "sum_tolerance",
]
