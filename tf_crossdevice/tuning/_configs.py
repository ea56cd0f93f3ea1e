"""A configuration: a constructor call as plain data, `(class name, kwargs)`.

The one format the candidate list (`_grid`), autotune's cache files and
the cost model share (`Config` is `_grid.Config`, public as
`cost_model.Config`). `from_json` restores what JSON turned into lists,
`label` names a configuration in logs and results, and `make_ops` builds
the CrossDeviceOps it names for a `Topology`.
"""

from __future__ import annotations

import json
from typing import Any

import tensorflow as tf

from tf_crossdevice import collective, ops
from tf_crossdevice.tuning._topology import Topology
from tf_crossdevice.tuning.cost_model import Config

# The classes a configuration may name.
_CLASSES = {
    "SpecAllReduce": ops.SpecAllReduce,
    "MultiWorkerAllReduce": ops.MultiWorkerAllReduce,
    "ReductionToOneDevice": ops.ReductionToOneDevice,
    "AllReduceCrossDeviceOps": ops.AllReduceCrossDeviceOps,
    "HierarchicalCopyAllReduce": ops.HierarchicalCopyAllReduce,
    "NcclAllReduce": ops.NcclAllReduce,
    "CollectiveAllReduce": collective.CollectiveAllReduce,
    "HierarchicalCollectiveAllReduce": (
        collective.HierarchicalCollectiveAllReduce
    ),
}


def from_json(config: Any) -> tuple[str, dict[str, Any]]:
    """A configuration read from JSON: its spec's lists become tuples.

    >>> from_json(["SpecAllReduce", {"all_reduce_spec": ["xring", 2, -1]}])
    ('SpecAllReduce', {'all_reduce_spec': ('xring', 2, -1)})
    """
    name, kwargs = config[0], dict(config[1])
    spec = kwargs.get("all_reduce_spec")
    if isinstance(spec, list):
        kwargs["all_reduce_spec"] = (
            [tuple(r) for r in spec]
            if spec and isinstance(spec[0], list)
            else tuple(spec)
        )
    return name, kwargs


def label(config: Config) -> str:
    """A short name for a configuration.

    >>> label(("SpecAllReduce", {"all_reduce_spec": "xring", "num_packs": 1}))
    'SpecAllReduce xring num_packs=1'
    >>> label(("HierarchicalCopyAllReduce", {"num_packs": 0}))
    'HierarchicalCopyAllReduce num_packs=0'
    """
    name, kwargs = config
    parts = [name]
    spec = kwargs.get("all_reduce_spec", kwargs.get("all_reduce_alg"))
    if isinstance(spec, (tuple, list)) and len(spec) == 3 and spec[2] == -1:
        parts.append(f"{spec[0]}#{spec[1]}")
    elif spec is not None:
        parts.append(spec if isinstance(spec, str) else json.dumps(spec))
    aggregates = bool(kwargs.get("agg_small_grads_max_bytes"))
    # num_packs=0 is shown unless aggregation (which needs it) says more.
    if "num_packs" in kwargs and (kwargs["num_packs"] or not aggregates):
        parts.append(f"num_packs={kwargs['num_packs']}")
    if aggregates:
        parts.append(
            f"agg_small={kwargs['agg_small_grads_max_bytes'] >> 10}KiB"
            f"x{kwargs.get('agg_small_grads_max_group', 10)}"
        )
    if kwargs.get("compression"):
        parts.append(f"compression={kwargs['compression']}")
    other = set(kwargs) - {
        "all_reduce_spec",
        "all_reduce_alg",
        "num_packs",
        "agg_small_grads_max_bytes",
        "agg_small_grads_max_group",
        "compression",
    }
    parts += [f"{k}={kwargs[k]!r}" for k in sorted(other)]
    return " ".join(parts)


def make_ops(config: Any, topology: Topology) -> tf.distribute.CrossDeviceOps:
    """The CrossDeviceOps a configuration names, for `topology`.

    MultiWorkerAllReduce gets the topology's workers; the collective classes
    its worker and device counts.

    Raises:
        ValueError: an unknown class or a bad argument (the class's error).
        TypeError: not a (class name, kwargs) pair, or bad kwargs.
    """
    if (
        not isinstance(config, (tuple, list))
        or len(config) != 2
        or not isinstance(config[1], dict)
    ):
        raise TypeError(
            f"config: expected (class name, kwargs dict), got {config!r:.120}"
        )
    name, kwargs = from_json(config)
    cls = _CLASSES.get(name)
    if cls is None:
        raise ValueError(
            f"config: unknown class {name!r}; expected one of "
            f"{', '.join(sorted(_CLASSES))}"
        )
    if isinstance(kwargs.get("options"), dict):
        kwargs["options"] = tf.distribute.experimental.CommunicationOptions(
            **kwargs["options"]
        )
    gpus = topology.local_devices if topology.device_type == "GPU" else 0
    if name == "MultiWorkerAllReduce":
        return cls(list(topology.worker_devices), gpus, **kwargs)
    if name == "CollectiveAllReduce":
        kwargs.setdefault("num_workers", topology.num_workers)
        kwargs.setdefault("num_gpus_per_worker", gpus)
    return cls(**kwargs)
