"""Packing many tensors into fewer, larger ones before they are reduced.

`_plan` decides (pure Python: which tensors go together, split sizes),
`_pack` does it in TensorFlow, `_packed_all_reduce` validates the packing
arguments of the single-worker all-reduce classes (`check_packing`) and
packs, all-reduces (with a callable it is given) and unpacks their values
(`packed_all_reduce`). For the collective classes, `_collective_plan`
groups the values of one collective step into packs (pure Python) and
`_collective_pack` sizes the tensors for it and flattens and unflattens a
pack in TensorFlow.

May import: `_core`.
"""

from tf_crossdevice.packing._collective_pack import (
    flatten_pack,
    plan_packs,
    unflatten_pack,
)
from tf_crossdevice.packing._collective_plan import (
    DEFAULT_BYTES_PER_PACK,
    collective_packs,
)
from tf_crossdevice.packing._pack import Packer, make_packer
from tf_crossdevice.packing._packed_all_reduce import (
    BatchAllReduce,
    PackedAllReduce,
    check_packing,
    packed_all_reduce,
)
from tf_crossdevice.packing._plan import (
    PackingScheme,
    concat_and_split_plan,
    packing_scheme,
    small_tensor_plan,
)

__all__ = [
    "BatchAllReduce",
    "DEFAULT_BYTES_PER_PACK",
    "PackedAllReduce",
    "Packer",
    "PackingScheme",
    "check_packing",
    "collective_packs",
    "concat_and_split_plan",
    "flatten_pack",
    "make_packer",
    "packed_all_reduce",
    "packing_scheme",
    "plan_packs",
    "small_tensor_plan",
    "unflatten_pack",
]
