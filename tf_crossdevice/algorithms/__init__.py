"""The all-reduce algorithms, one module each, with their pure schedules.

Every algorithm is a builder with one call shape (`_protocol`), registered
by name in `_registry`; two-level algorithms (`inner/outer`) are composed
from the registry. How values cross workers (a 16-bit codec or none, and
which links count as crossing) is one `tf_crossdevice.compression.WirePolicy`,
the `wire=` keyword of every factory. A builder's schedule (who sends which
chunk to whom) is pure Python beside it (`_ring_schedule.py` beside
`_ring.py`), so it can be tested without TensorFlow. `_spec` parses TF 1's
`all_reduce_spec` grammar.

May import: `_core`, `compression`.
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
