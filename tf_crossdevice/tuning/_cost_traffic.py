"""A configuration's traffic: the busiest worker's counts for one step.

`_traffic` counts one all-reduce of one pack by one algorithm; this module
follows a configuration's builders around it: the packs its packer plans
(`tf_crossdevice.packing`, the collectives' too), each pack's algorithm
from the spec's ranges, compression, and the packs summed into one
`Traffic` per step (`traffic_of`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from tf_crossdevice import algorithms as spec_lib
from tf_crossdevice import compression as codec
from tf_crossdevice import packing as packing_lib
from tf_crossdevice._core import checks
from tf_crossdevice.tuning import _traffic as traffic
from tf_crossdevice.tuning._cost_inputs import (
    ALGORITHMS,
    COMPRESSIBLE,
    ITEMSIZE,
    PACKING,
    Gradients,
    Tensor,
    check_config,
    check_gradients,
)
from tf_crossdevice.tuning._grid import Config
from tf_crossdevice.tuning._traffic import Traffic


class _Pack(NamedTuple):
    num_bytes: int
    dtype: str


def _plan_packs(
    tensors: list[Tensor], kwargs: Mapping[str, Any]
) -> tuple[list[_Pack], list[tuple[list[float], int]]]:
    """The packs of the graph builders' packers (`tf_crossdevice.packing`), and
    each concatenating group's member bytes and pack count."""
    scheme = packing_lib.packing_scheme(
        num_packs=kwargs["num_packs"],
        agg_small_grads_max_bytes=kwargs["agg_small_grads_max_bytes"],
        agg_small_grads_max_group=kwargs["agg_small_grads_max_group"],
    )
    infos = [(t.elements, t.itemsize, t.dtype) for t in tensors]
    if scheme is packing_lib.PackingScheme.IDENTITY:
        return [_Pack(t.num_bytes, t.dtype) for t in tensors], []
    if scheme is packing_lib.PackingScheme.CONCAT_AND_SPLIT:
        plan = packing_lib.concat_and_split_plan(infos, kwargs["num_packs"])
    else:
        plan = packing_lib.small_tensor_plan(
            infos,
            kwargs["agg_small_grads_max_bytes"],
            kwargs["agg_small_grads_max_group"],
        )
    packs = []
    groups = []
    for group in plan:
        dtype = tensors[group.members[0]].dtype
        size = ITEMSIZE[dtype]
        packs += [_Pack(e * size, dtype) for e in group.pack_sizes]
        if group.concat:
            member_bytes = [float(e * size) for e in group.member_sizes]
            groups.append((member_bytes, len(group.pack_sizes)))
    return packs, groups


def _single(alg: str, size: float, n: int, k: int, shards: int) -> Traffic:
    if alg == "xring":
        return traffic.ring(size, n, k, shards)
    if alg == "nccl":  # one kernel per device, ring traffic
        return traffic.ring(size, n, k, shards, 0, 1, 0)
    if alg == "rechd":
        return traffic.halving_doubling(size, n, k, shards)
    if alg in ("pscpu", "psgpu"):
        return traffic.shuffle(size, n, k, shards, per_worker=alg == "pscpu")
    if alg == "hierarchical_copy":
        return traffic.hierarchical_copy(size, n, k).scaled(shards)
    raise ValueError(
        f"all_reduce_spec: unknown algorithm {alg!r}; expected "
        f"{spec_lib.describe_algorithms(ALGORITHMS)}"
    )


def _algorithm(alg: str, size: float, n: int, k: int, shards: int) -> Traffic:
    parts = spec_lib.split_two_level(alg)
    if parts is None:
        return _single(alg, size, n, k, shards)
    inner, outer = parts
    return traffic.two_level(
        _single(inner, size, k, k, 1) if k > 1 else traffic.NONE,
        _single(outer, size, n // k, 1, shards) if n > k else traffic.NONE,
        size,
        n,
        k,
    )


def _scaled(dtype: str, compression: str | None) -> bool:
    """Whether the codec scales each message into its range (the codec's
    own rule: bfloat16 has float32's exponent range, half and float64
    need a scale)."""
    return compression == "fp16" or dtype == "float64"


def _compress(t: Traffic, dtype: str, compression: str | None) -> Traffic:
    if compression is None or dtype not in COMPRESSIBLE:
        return t
    if not _scaled(dtype, compression):
        return t.compressed(2 / ITEMSIZE[dtype], cast_ops=2)
    # Its largest and smallest value and a multiply before the cast, a
    # multiply after it.
    return t.compressed(2 / ITEMSIZE[dtype], cast_ops=4, passes=6)


def _packed_traffic(
    tensors: list[Tensor],
    kwargs: Mapping[str, Any],
    ranges: Sequence[spec_lib.AllReduceSpecTuple],
    n: int,
    k: int,
    compression: str | None,
) -> Traffic:
    packs, groups = _plan_packs(tensors, kwargs)
    total = traffic.NONE
    for member_bytes, num_packs in groups:
        total += traffic.pack_traffic(member_bytes, num_packs, k)
    # Equal packs cost alike: price each size once.
    each = []
    for pack, count in collections.Counter(packs).items():
        chosen = spec_lib.select_range(ranges, pack.num_bytes)
        t = _algorithm(chosen.alg, pack.num_bytes, n, k, chosen.shards)
        t = dataclasses.replace(t, serial_bytes=float(pack.num_bytes))
        each.append((_compress(t, pack.dtype, compression), count))
    return _packs_total(total, each)


def _packs_total(
    total: Traffic, packs: Iterable[tuple[Traffic, int]]
) -> Traffic:
    """`total` plus each pack's counts times its count; the serial and
    one-way bytes are the largest of any one pack's, not a sum: other
    packs' transfers hide their processing and fill the idle direction
    (`Traffic.serial_bytes`, `Traffic.one_way_bytes`)."""
    serial = one_way = 0.0
    for t, count in packs:
        total += t.scaled(count)
        serial = max(serial, t.serial_bytes)
        one_way = max(one_way, t.one_way_bytes)
    return dataclasses.replace(
        total, serial_bytes=serial, one_way_bytes=one_way
    )


def _bytes_per_pack(options: object, argument: str) -> int:
    if options is None:
        return 0
    if isinstance(options, Mapping):
        value = options.get("bytes_per_pack", 0)
    else:  # tf.distribute.experimental.CommunicationOptions
        value = getattr(options, "bytes_per_pack", 0)
    return checks.non_negative_int(value, f"{argument}.bytes_per_pack")


def _collective_traffic(
    tensors: list[Tensor],
    packs: list[list[int]],
    n: int,
    k: int,
    hierarchical: bool,
    compression: str | None,
) -> Traffic:
    """TensorFlow's RING collective per pack, around flatten/unflatten.

    The ring is one kernel per device (no graph op per step); its CPU
    RingReducer first copies the input into the output buffer (one copy).
    """
    each = []
    workers = n // k
    # The hierarchical class reduces each worker's devices first, then runs
    # its collective with one member per worker.
    group, members_here = (workers, 1) if hierarchical else (n, k)
    # Compressed, a group of 2 or 3 members gathers 16-bit messages;
    # larger groups reduce exactly (`codec.gather_compression_pays`).
    gathers = (
        compression is not None
        and workers > 1
        and codec.gather_compression_pays(group)
    )
    launched = Traffic(collectives=1 if workers > 1 else 0)
    for pack in packs:
        size = float(sum(tensors[i].num_bytes for i in pack))
        dtype = tensors[pack[0]].dtype
        # What the pack's processing handles once its transfer is done: the
        # pack; or, gathered compressed, the `group` messages every member
        # decodes to full precision and sums.
        gathered = gathers and dtype in COMPRESSIBLE
        t = traffic.pack_traffic(
            [float(tensors[i].num_bytes) for i in pack], 1, k
        ) + Traffic(serial_bytes=size * group if gathered else size)
        if hierarchical and k > 1:
            t += traffic.one_device(size, k, k)
        if gathered:
            ratio = 2 / ITEMSIZE[dtype]
            scaled = _scaled(dtype, compression)
            t += traffic.compressed_gather(
                size, group, members_here, ratio, scaled
            )
            t += Traffic(ops=2 * group if scaled else 0)
        else:
            t += traffic.ring(size, group, members_here, 1, 0, 1, 1)
        each.append((t + launched, 1))
    return _packs_total(traffic.NONE, each)


def traffic_of(
    config: Config,
    gradients: Gradients,
    *,
    devices_per_worker: int,
    num_workers: int = 1,
) -> Traffic:
    """The busiest worker's counts for one step of `config`.

    Args and Raises: as `predict`.

    >>> t = traffic_of(("SpecAllReduce", {"all_reduce_spec": "xring"}),
    ...                [((10,), "float32")], devices_per_worker=2)
    >>> t.mem_messages, t.mem_bytes   # 2 devices x 2(p-1) chunks of 20 B
    (4.0, 80.0)
    """
    name, kwargs = check_config(config)
    tensors = check_gradients(gradients)
    k = checks.positive_int(devices_per_worker, "devices_per_worker")
    workers = checks.positive_int(num_workers, "num_workers")
    return _step_traffic(name, kwargs, tensors, workers * k, k)


def _step_traffic(
    name: str,
    kwargs: dict[str, Any],
    tensors: list[Tensor],
    n: int,
    k: int,
) -> Traffic:
    """The busiest worker's counts."""
    workers = n // k
    compression = codec.check_compression(kwargs.get("compression"))
    if name in ("SpecAllReduce", "MultiWorkerAllReduce"):
        ranges = spec_lib.parse_all_reduce_spec(
            kwargs["all_reduce_spec"], ALGORITHMS
        )
        if name == "MultiWorkerAllReduce":
            devices = kwargs["worker_devices"]
            if devices is not None and len(devices) != workers:
                raise ValueError(
                    f"worker_devices: {len(devices)} workers listed, but "
                    f"num_workers={workers}"
                )
        return _packed_traffic(tensors, kwargs, ranges, n, k, compression)
    if name in ("AllReduceCrossDeviceOps", "NcclAllReduce"):
        kwargs = {**PACKING, **kwargs}
        alg = kwargs.get("all_reduce_alg", "nccl")
        spec_lib.check_algorithm(alg, ALGORITHMS, "all_reduce_alg")
        ranges = (spec_lib.AllReduceSpecTuple(alg),)
        return _packed_traffic(tensors, kwargs, ranges, n, k, compression)
    if name in ("HierarchicalCopyAllReduce", "tf.HierarchicalCopyAllReduce"):
        kwargs = {**PACKING, **kwargs}
        ranges = (spec_lib.AllReduceSpecTuple("hierarchical_copy"),)
        return _packed_traffic(tensors, kwargs, ranges, n, k, compression)
    if name in ("ReductionToOneDevice", "tf.ReductionToOneDevice"):
        each = [
            (
                _compress(
                    traffic.one_device(float(t.num_bytes), n, k)
                    + Traffic(serial_bytes=float(t.num_bytes)),
                    t.dtype,
                    compression,
                ),
                count,
            )
            for t, count in collections.Counter(tensors).items()
        ]
        return _packs_total(traffic.NONE, each)
    return _collective_step_traffic(name, kwargs, tensors, n, k, compression)


def _collective_step_traffic(
    name: str,
    kwargs: dict[str, Any],
    tensors: list[Tensor],
    n: int,
    k: int,
    compression: str | None,
) -> Traffic:
    """The busiest worker's counts for the collectives, TF's MWMS among
    them: packs of `options.bytes_per_pack`."""
    workers = n // k
    options = kwargs.get("options")
    bytes_per_pack = _bytes_per_pack(options, "options")
    sizes = [t.num_bytes for t in tensors]
    dtypes = [t.dtype for t in tensors]
    if name == "CollectiveAllReduce":
        if kwargs["num_workers"] not in (None, workers):
            raise ValueError(
                f"num_workers: config says {kwargs['num_workers']}, the "
                f"call {workers}"
            )
        scope = kwargs["all_reduce_merge_scope"]
        if scope is not None:
            scope = checks.positive_int(scope, "all_reduce_merge_scope")
        packs = packing_lib.collective_packs(
            sizes, dtypes, bytes_per_pack, scope
        )
        return _collective_traffic(tensors, packs, n, k, False, compression)
    if name == "HierarchicalCollectiveAllReduce":
        packs = packing_lib.collective_packs(sizes, dtypes, bytes_per_pack)
        return _collective_traffic(tensors, packs, n, k, True, compression)
    # tf.MultiWorkerMirroredStrategy: one RING collective per pack of
    # `bytes_per_pack` (0: all values in one pack).
    implementation = kwargs["implementation"]
    if implementation not in ("RING", "AUTO"):
        raise ValueError(
            f"implementation: the model knows 'RING' and 'AUTO' (RING on "
            f"CPUs), got {implementation!r}"
        )
    packs = packing_lib.collective_packs(
        sizes, dtypes, bytes_per_pack, max(1, len(tensors))
    )
    return _collective_traffic(tensors, packs, n, k, False, None)
