"""An alpha-beta cost model of every all-reduce configuration of the package.

A configuration is a constructor call as plain data, `(class_name, kwargs)`:

    ("SpecAllReduce", {"all_reduce_spec": "xring", "num_packs": 1})
    ("MultiWorkerAllReduce", {"all_reduce_spec": ("pscpu/pscpu", 2, -1)})
    ("CollectiveAllReduce", {"options": {"bytes_per_pack": 4 << 20}})

and gradients are `(shape, dtype_name)` pairs, one per tensor of a replica.
`predict` gives seconds per all-reduce step, `recommend` the fastest
configuration it knows for a cluster, `fit` the constants from measured
steps (with SciPy: `pip install scipy`, or the `fit` extra). Nothing here
runs a TensorFlow op.

The model (Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", 2005), per worker process:

    seconds = alpha_net * network messages + beta_net * network bytes
            + alpha_mem * memory messages  + beta_mem * memory bytes
            + gamma * (bytes reduced + bytes copied) + delta * graph ops
            + alpha_collective * collectives launched across workers
            + step
            + beta_incast * bytes received from several senders at once
            + beta_serial * bytes of the largest pack

where "memory" is a transfer between logical devices of one process and
"network" one between worker processes (its bytes are what the busiest
worker's link carries each way, plus those of one pack it carries one
way while the other way idles, `Traffic.one_way_bytes`: so on hosts
whose link of known rate is the bottleneck `beta_net` is the inverse of
the rate the payload gets, `constants_for_link`); "bytes copied" are
the memcpys
of packing and flattening (a concatenation, a pad); `step` is a fixed
cost per all-reduce step. The counts come from
`tf_crossdevice.tuning._traffic` and follow the builders:

- ring ("xring", and the collectives' RING): `2(p-1)` messages,
  `2(p-1)/p n` bytes sent and `(p-1)/p n` reduced per device, per pack.
- recursive halving-doubling ("rechd"): `2 log2(p)` messages and the same
  bytes for a power of two `p`; otherwise the `r = p - 2**floor(log2 p)`
  extra devices fold into partners first, which pay one more message and
  `n` more bytes each way (`(2 log2 p' + 1)` messages on a partner).
- shuffle ("pscpu", "psgpu"): every device sends each shard to its owner,
  the owner sums `p` copies and broadcasts the sum: `2(p-1)` messages of
  the shard on the owner, a gather then a broadcast.
- hierarchical copy and reduction to one device: `2(p-1)` whole-tensor
  messages through one or two roots.
- a link used one way at a time: a reduction's root, a shuffle owner
  that receives more of its shards in the gather than it sends of the
  others', and halving-doubling's fold-in partner receive before they
  send, the other direction idle; those bytes count again in the
  network bytes, those of the pack with the most (other packs fill the
  idle direction: `Traffic.one_way_bytes`).
- two-level 'inner/outer': the inner algorithm on each worker's devices,
  the outer across one device per worker, then `k-1` copies back.
- packing changes how many all-reduces run and how large they are
  (`tf_crossdevice.packing` plans the packs, the collectives' too) and adds
  concat/split ops and copies on every device; spec ranges pick each pack's
  algorithm by its bytes.
- compression ('bf16', 'fp16') halves float32 wire bytes (quarters
  float64), and costs a cast at each end of every message, priced like a
  sum; a scaled message ('fp16', and 'bf16' of float64) also finds its
  largest and smallest value and multiplies at each end: 6 passes, not 2.
  The collectives compress only groups of 2 or 3 members, by one
  all-gather of the 16-bit messages that every member decodes and sums
  (`traffic.compressed_gather`); larger groups all-reduce exactly.

A worker's devices share its CPU thread pool, so their counts add; workers
run in parallel, so a step costs the busiest worker's time. The per-op
delta is what makes many small tensors slow on CPUs: every tensor costs
ops on every device whatever its size.

>>> grads = [((1000, 1000), "float32")] * 4
>>> ring = ("SpecAllReduce", {"all_reduce_spec": "xring"})
>>> pscpu = ("SpecAllReduce", {"all_reduce_spec": "pscpu"})
>>> round(predict(ring, grads, devices_per_worker=4), 4) > 0
True
>>> config, seconds = recommend(grads, num_workers=64)
>>> config[0] in ("MultiWorkerAllReduce", "CollectiveAllReduce",
...               "HierarchicalCollectiveAllReduce")
True

The parts live in private modules: `_cost_inputs` (configurations and
gradients, checked), `_cost_traffic` (a configuration's counts per step),
`_cost_constants` (the constants, the fits shipped, link rates),
`_cost_least_squares` (the solver), `_cost_fit` (measurements and `fit`)
and `_cost_predict` (`predict`, `candidates`, `recommend`).
"""

from tf_crossdevice.tuning._cost_constants import (
    DEFAULT_CONSTANTS,
    FIELDS,
    LOOPBACK_FIELDS,
    Constants,
    at_link_rate,
    constants_for_link,
    features,
    ordering_constants,
)
from tf_crossdevice.tuning._cost_fit import Measurement, fit, measured_counts
from tf_crossdevice.tuning._cost_inputs import (
    ALGORITHMS,
    COMPRESSIBLE,
    COMPRESSIONS,
    CONFIG_NAMES,
    ITEMSIZE,
    Gradients,
)
from tf_crossdevice.tuning._cost_predict import candidates, predict, recommend
from tf_crossdevice.tuning._cost_traffic import traffic_of
from tf_crossdevice.tuning._grid import Config

__all__ = [
    "ALGORITHMS",
    "COMPRESSIBLE",
    "COMPRESSIONS",
    "CONFIG_NAMES",
    "Config",
    "Constants",
    "DEFAULT_CONSTANTS",
    "FIELDS",
    "Gradients",
    "ITEMSIZE",
    "LOOPBACK_FIELDS",
    "Measurement",
    "at_link_rate",
    "candidates",
    "constants_for_link",
    "features",
    "fit",
    "measured_counts",
    "ordering_constants",
    "predict",
    "recommend",
    "traffic_of",
]
