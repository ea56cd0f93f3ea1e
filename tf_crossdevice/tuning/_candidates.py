"""What autotune times: a selection of the package's candidate list, in
the order it tries them."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from tf_crossdevice import algorithms as spec_lib
from tf_crossdevice import compression as codec
from tf_crossdevice.tuning import _grid, cost_model
from tf_crossdevice.tuning._configs import Config
from tf_crossdevice.tuning._topology import GradientList, Topology, num_bytes

# At most this many configurations are timed without compression: each is
# traced, checked against numpy and timed within the budget, so a search
# stays short.
MOST = 20
# Across workers, for float gradients, the likeliest this many are also
# timed with each `compression` codec.
COMPRESSED = 4


def timed_candidates(
    topology: Topology, gradients: GradientList
) -> list[Config]:
    """The configurations autotune builds and times, likeliest first.

    A selection from `cost_model.candidates` for the topology (which holds
    NCCL on GPUs only): what one client builds in its own graph
    (`_grid.IN_GRAPH`; the between-graph collectives run in every worker's
    own program), one algorithm per configuration (a spec range runs on
    each pack an algorithm that is timed alone), with packing that changes
    these gradients (`_changes_something`). Of those, each algorithm's
    likeliest (so that an error of the model on one algorithm cannot leave
    it out), then the likeliest others, `MOST` in all, likeliest meaning
    fastest predicted (`ordered`). Across workers, for float gradients, the
    first `COMPRESSED` of them again with each `compression` codec.
    Returned in `ordered`'s order: what a short budget leaves out is the
    end.
    """
    grid = cost_model.candidates(
        topology.num_workers,
        topology.local_devices,
        device_type=topology.device_type,
    )
    timeable = [
        c
        for c in grid
        if c[0] in _grid.IN_GRAPH
        and not isinstance(c[1].get("all_reduce_spec"), list)
        and _changes_something(c, gradients)
    ]
    likeliest = [c for c, _ in ordered(timeable, topology, gradients)]
    firsts: dict[tuple[str, ...], int] = {}
    for i, config in enumerate(likeliest):
        firsts.setdefault(_algorithms(config), i)
    chosen = sorted(firsts.values())[:MOST]
    taken = set(chosen)
    others = [i for i in range(len(likeliest)) if i not in taken]
    chosen += others[: MOST - len(chosen)]
    kept = [likeliest[i] for i in sorted(chosen)]
    floats = any(d in cost_model.COMPRESSIBLE for _, d in gradients)
    if topology.num_workers > 1 and floats:
        kept += [
            (name, {**kwargs, "compression": wire})
            for name, kwargs in kept[:COMPRESSED]
            for wire in codec.COMPRESSIONS
        ]
    return [c for c, _ in ordered(kept, topology, gradients)]


def _algorithms(config: Config) -> tuple[str, ...]:
    """The algorithms a configuration runs: its spec's, in order, else its
    class's ('hierarchical_copy' for the hierarchical copy classes)."""
    name, kwargs = config
    if "all_reduce_spec" in kwargs:
        ranges = spec_lib.parse_all_reduce_spec(
            kwargs["all_reduce_spec"], cost_model.ALGORITHMS
        )
        return tuple(r.alg for r in ranges)
    if name == "HierarchicalCopyAllReduce":
        return ("hierarchical_copy",)
    return (kwargs.get("all_reduce_alg", name),)


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
    """Fastest predicted first (`cost_model.predict` with
    `cost_model.ordering_constants`); configurations it cannot predict
    keep their order after them."""
    constants = cost_model.ordering_constants(topology.num_workers)
    predictions: list[float | None] = []
    for config in configs:
        try:
            seconds: float | None = float(
                cost_model.predict(
                    config,
                    gradients,
                    devices_per_worker=topology.local_devices,
                    num_workers=topology.num_workers,
                    constants=constants,
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
