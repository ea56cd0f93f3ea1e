"""The all-reduce algorithms, by name, and TF 1's `all_reduce_spec` grammar.

Every algorithm is a builder with one call shape (one tensor per device
in, the i-th sum on the i-th tensor's device out), registered by name:
`algorithm_names` lists the single-level names, `check_algorithm` checks
a name and `describe_algorithms` says what a name may be, and `build`
returns the builder for a name. Two-level names (`inner/outer`, split by
`split_two_level`) are composed from the registry. `all_reduce_batch`
sums a batch of values with a builder; `sum_on_device` sums on one device.
How values cross workers (a 16-bit codec or none, and which links count
as crossing) is one `tf_crossdevice.compression.WirePolicy`, the `wire=`
keyword of `build`.

`parse_all_reduce_spec` reads TF 1's `all_reduce_spec` (in either form)
as `AllReduceSpecTuple` ranges, `select_range` picks the range that
reduces a tensor of a given size, and `format_all_reduce_spec` writes a
spec in the canonical string grammar.
"""

from tf_crossdevice.algorithms._protocol import all_reduce_batch
from tf_crossdevice.algorithms._reduction_to_one_device import sum_on_device
from tf_crossdevice.algorithms._registry import algorithm_names, build
from tf_crossdevice.algorithms._spec import (
    AllReduceSpecTuple,
    check_algorithm,
    describe_algorithms,
    format_all_reduce_spec,
    parse_all_reduce_spec,
    select_range,
    split_two_level,
)

__all__ = [
    "AllReduceSpecTuple",
    "algorithm_names",
    "all_reduce_batch",
    "build",
    "check_algorithm",
    "describe_algorithms",
    "format_all_reduce_spec",
    "parse_all_reduce_spec",
    "select_range",
    "split_two_level",
    "sum_on_device",
]
