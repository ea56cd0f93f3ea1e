"""The configurations autotune tries, and the order it tries them in."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from tf_crossdevice.compression import _codec as codec
from tf_crossdevice.tuning import cost_model
from tf_crossdevice.tuning._configs import Config
from tf_crossdevice.tuning._topology import GradientList, Topology, num_bytes

# Small-tensor aggregation: tensors of up to 64 KiB concatenated in groups
# of up to 1024, so that many small gradients cost a few reductions rather
# than one each.
AGGREGATE = {
    "agg_small_grads_max_bytes": 64 << 10,
    "agg_small_grads_max_group": 1024,
}


def timed_candidates(
    topology: Topology, gradients: GradientList
) -> list[Config]:
    """Every configuration autotune builds and times, likeliest first.

    Not `cost_model.candidates`, on purpose: the model prices its broad grid
    (every shard count, every packing, spec ranges, the between-graph
    collectives) for nothing, while each entry here is traced, checked
    against numpy and timed on the devices within a budget. So this list is
    short, and it holds only what one client can time: in-graph reductions
    (between-graph collectives run in each worker's own program), NCCL
    only on GPUs, the `compression` codecs only for float gradients, and no
    packing that leaves these gradients as they are (`_changes_something`).

    The order is what `ordered` keeps for configurations the cost model
    cannot price, and what a short budget cuts from the end. On one worker,
    small-tensor aggregation with the shard-summing algorithms (pscpu,
    psgpu, hierarchical copy) comes first, since every tensor costs ops on
    every device whatever its size; one pack next; unpacked ring and
    halving-doubling come last, since they trace a sub-graph per tensor
    and are the slowest to build. Across workers: pscpu with aggregation,
    then the two-level default.
    """
    packings: list[dict[str, int]] = [AGGREGATE, {"num_packs": 1}]
    if topology.num_workers == 1:
        gpu = topology.device_type == "GPU"
        algs = ["pscpu", "psgpu", "hierarchical_copy"]
        out: list[Config] = [
            ("SpecAllReduce", _spec("nccl", p))
            for p in (packings if gpu else ())
        ]
        out += [("SpecAllReduce", _spec(a, AGGREGATE)) for a in algs]
        out.append(("ReductionToOneDevice", {}))
        out += [
            ("SpecAllReduce", _spec(a, {"num_packs": 1}))
            for a in [*algs, "xring", "rechd", "xring#2"]
        ]
        out += [
            ("SpecAllReduce", _spec(a, AGGREGATE)) for a in ("xring", "rechd")
        ]
        out += [
            ("SpecAllReduce", _spec(a, {"num_packs": 4}))
            for a in ("pscpu", "hierarchical_copy", "xring")
        ]
        out += [
            ("SpecAllReduce", _spec(a, {})) for a in [*algs, "xring", "rechd"]
        ]
        if gpu:
            out.append(("SpecAllReduce", _spec("nccl", {})))
    else:
        specs = ["pscpu", "pscpu/pscpu#2", "xring", "rechd", "xring#2"]
        if topology.local_devices > 1:
            specs[2:2] = ["pscpu/xring", "pscpu/rechd"]
        if topology.device_type == "GPU":
            specs[:0] = ["nccl/pscpu", "nccl/xring", "nccl/rechd"]
        out = [
            ("MultiWorkerAllReduce", _spec(s, p))
            for p in packings
            for s in specs
        ]
        floats = any(d in ("float32", "float64") for _, d in gradients)
        for wire in codec.COMPRESSIONS if floats else ():
            out += [
                ("MultiWorkerAllReduce", _spec(s, p) | {"compression": wire})
                for p in packings
                for s in specs[:2]
            ]
        out += [("MultiWorkerAllReduce", _spec(s, {})) for s in specs]
    return [c for c in out if _changes_something(c, gradients)]


def _spec(alg: str, packing: dict[str, int]) -> dict[str, Any]:
    """kwargs of a spec class; 'alg#n' becomes the tuple (alg, n, -1)."""
    name, _, shards = alg.partition("#")
    spec: Any = (name, int(shards), -1) if shards else name
    return {"all_reduce_spec": spec, "num_packs": 0} | packing


def _changes_something(config: Config, gradients: GradientList) -> bool:
    """False for packing that leaves the gradients as they are (one pack of
    one tensor, aggregation with fewer than two small tensors), and for
    aggregation that packs exactly as one pack does (every gradient small
    and few enough for one group per dtype: num_packs=1 is tried)."""
    kwargs = config[1]
    if kwargs.get("num_packs") == 1:
        return len(gradients) > 1
    limit = kwargs.get("agg_small_grads_max_bytes", 0)
    if not limit:
        return True
    small = [g for g in gradients if num_bytes(g) <= limit]
    per_dtype = collections.Counter(dtype for _, dtype in gradients)
    one_pack = len(small) == len(gradients) and max(
        per_dtype.values()
    ) <= kwargs.get("agg_small_grads_max_group", 0)
    return len(small) >= 2 and not one_pack


def ordered(
    configs: Sequence[Config], topology: Topology, gradients: GradientList
) -> list[tuple[Config, float | None]]:
    """Fastest predicted first (`cost_model.predict`); configurations it
    cannot predict keep their order after them."""
    predictions: list[float | None] = []
    for config in configs:
        try:
            seconds: float | None = float(
                cost_model.predict(
                    config,
                    gradients,
                    devices_per_worker=topology.local_devices,
                    num_workers=topology.num_workers,
                )
            )
        except ValueError:
            seconds = None
        predictions.append(seconds)
    order = sorted(
        range(len(configs)),
        key=lambda i: (predictions[i] is None, predictions[i] or 0.0, i),
    )
    return [(configs[i], predictions[i]) for i in order]
