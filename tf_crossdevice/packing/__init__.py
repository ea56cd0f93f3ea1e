"""Packing many tensors into fewer, larger ones before they are reduced.

For the single-worker all-reduce classes, `check_packing` validates their
packing arguments, `packing_scheme` says which `PackingScheme` they
select, and `packed_all_reduce` packs, all-reduces (with a
`BatchAllReduce` it is given) and unpacks their values. `make_packer`
plans a `Packer` from `concat_and_split_plan` or `small_tensor_plan`
(pure Python: which tensors go together, split sizes), and
`PackedAllReduce` is an algorithm's batch all-reduce after packing.

For the collective classes, `collective_packs` groups the values of one
collective step into packs (pure Python; `plan_packs` for tensors;
`bytes_per_pack=0` without a merge scope gives packs of
`DEFAULT_BYTES_PER_PACK`), and `flatten_pack` and `unflatten_pack`
flatten and unflatten a pack in TensorFlow.
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
