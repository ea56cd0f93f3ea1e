"""MultiWorkerMirroredStrategy: TensorFlow's, with our collectives inside.

Every worker process runs the same program with its own `TF_CONFIG` (or
cluster resolver) and builds

    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=tf_crossdevice.HierarchicalCollectiveAllReduce(),
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=300),
        local_devices=["/cpu:0", "/cpu:1"])

It is a `tf.distribute.MultiWorkerMirroredStrategy` (Keras and `isinstance`
checks see one): `num_replicas_in_sync` counts every replica of every
worker, datasets are sharded between workers, `model.fit` and
`strategy.run` train as TensorFlow's strategy does. The differences:

- our collective classes do the reductions, and any number of local
  devices per worker take part (logical CPUs too; TensorFlow's uses one CPU
  per worker);
- construction never blocks for good: it enables collectives itself
  (`tf_crossdevice.enable_collectives`, without TensorFlow's coordination
  service) and waits for the other workers with
  `tf_crossdevice.wait_for_peers`, at most `timeout_seconds`, raising a
  `tf.errors.DeadlineExceededError` that names the workers that did not
  come (TensorFlow's blocks in its constructor and ignores SIGTERM);
- variables' initial values are broadcast from the chief with the same
  timeout;
- `strategy.reduce` takes `options=` (TF 2.2's CollectiveHints call), and
  reduces nested structures, as Keras 3 calls it;
- a collective that fails because a peer is cut off names the peer tasks
  that cannot be reached and their addresses: by itself in an eager
  `strategy.reduce`, and in a step the user calls inside
  `with tf_crossdevice.reporting_unreachable_peers(strategy):` (the step's
  error surfaces in the user's call, out of the strategy's reach).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks as _checks
from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice._core import reprs, tf_internal, values
from tf_crossdevice.collective import _runtime as collective_runtime
from tf_crossdevice.collective._all_reduce import CollectiveAllReduce
from tf_crossdevice.collective._default import default_collective
from tf_crossdevice.collective._group import Group, Options
from tf_crossdevice.collective._peers import reporting_unreachable_peers
from tf_crossdevice.collective._reducer import CollectiveReducer
from tf_crossdevice.ops import CrossDeviceOpsAdapter

_Strategy, _TFExtended = tf_internal.multi_worker_strategy_parts()


class MultiWorkerMirroredStrategy(
    reprs.ConstructorRepr, tf.distribute.MultiWorkerMirroredStrategy
):
    """Between-graph synchronous training with tf_crossdevice's collectives.

    Without `TF_CONFIG` (or a cluster) one process trains alone:

    >>> strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
    ...     local_devices=["/cpu:0", "/cpu:1"])
    >>> strategy.num_replicas_in_sync
    2
    >>> @tf.function
    ... def step():
    ...     ctx = tf.distribute.get_replica_context()
    ...     return ctx.all_reduce("sum", ctx.replica_id_in_sync_group + 1)
    >>> sums = strategy.experimental_local_results(strategy.run(step))
    >>> [int(v) for v in sums]
    [3, 3]

    Args:
        cross_device_ops: `tf_crossdevice.CollectiveAllReduce` or
            `tf_crossdevice.HierarchicalCollectiveAllReduce`. The strategy
            uses a copy that knows the workers and the local devices.
            Default: the hierarchical class with several CPU devices per
            worker and several workers, else the flat one, each with its
            default arguments (measured fastest; the choice is logged once).
        cluster_resolver: the cluster and this task's place in it; None reads
            `TF_CONFIG`. Without a cluster, one process trains alone.
        communication_options: default
            `tf.distribute.experimental.CommunicationOptions` for every
            collective (the collective object's own options and a call's
            override them). Its `timeout_seconds` also bounds the wait for
            the other workers during construction.
        local_devices: this worker's devices, e.g. ["/cpu:0", "/cpu:1"] or
            ["/gpu:0", "/gpu:1"] (the job and task are this worker's).
            Default: every GPU, or `num_gpus_per_worker` of them for a
            CollectiveAllReduce that sets it; the CPU without GPUs.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a device that does not exist, a cluster without this
            task.
        tf.errors.DeadlineExceededError: a worker did not start within
            `timeout_seconds`.
    """

    def __init__(
        self,
        cross_device_ops: Any = None,
        cluster_resolver: Any = None,
        communication_options: Any = None,
        local_devices: Sequence[str] | None = None,
    ) -> None:
        start = time.monotonic()
        options = values.check_options(
            communication_options, "communication_options"
        )
        chosen = cross_device_ops is None
        if chosen:
            # Replaced below once the devices and workers are known.
            cross_device_ops = CollectiveAllReduce()
        reducer = _collective_reducer(cross_device_ops)
        if reducer is None:
            raise TypeError(
                "cross_device_ops: expected tf_crossdevice.CollectiveAllReduce "
                "or tf_crossdevice.HierarchicalCollectiveAllReduce, got "
                f"{type(cross_device_ops).__name__}; single-worker classes go "
                "to tf.distribute.MirroredStrategy(cross_device_ops=...)"
            )
        if cluster_resolver is None:
            cluster_resolver = (
                tf.distribute.cluster_resolver.TFConfigClusterResolver()
            )
        cluster = collective_runtime.enable_collectives(cluster_resolver)
        timeout = options.merge(reducer.constructor_options).timeout_seconds
        if timeout is not None:
            timeout = max(timeout - (time.monotonic() - start), 1e-3)
        collective_runtime.wait_for_peers(cluster, timeout)
        self._collective_cluster = cluster
        devices = _local_devices(local_devices, cluster, cross_device_ops)
        if chosen:
            # Both defaults share the process's collective keys, so
            # `reducer.keys` below stays right.
            cross_device_ops = default_collective(devices, cluster.num_workers)
        ops = _bound(cross_device_ops, devices, cluster.num_workers, options)
        # The strategy's own reductions on the worker's CPU (the host side
        # of a replica's values), with the same keys.
        host = _bound(
            CollectiveAllReduce(collective_keys=reducer.keys),
            [f"{cluster.worker_device}/device:CPU:0"],
            cluster.num_workers,
            options,
        )
        _Strategy.__init__(
            self,
            _Extended(self, cluster_resolver, options, devices, ops, host),
        )

    def reduce(
        self, reduce_op: Any, value: Any, axis: Any = None, options: Any = None
    ) -> Any:
        """`tf.distribute.Strategy.reduce`, with `options` for this call.

        Nested structures are reduced element by element, and `axis` is
        ignored for scalars (Keras 3 asks for both). Called eagerly, a
        collective that fails because a peer cannot be reached names it (see
        `tf_crossdevice.reporting_unreachable_peers`).
        """
        values.check_options(options)
        if tf.nest.is_nested(value):
            return tf.nest.map_structure(
                lambda v: self.reduce(reduce_op, v, axis, options), value
            )
        if axis is not None and all(
            getattr(t, "shape", None) is not None and t.shape.rank == 0
            for t in self.experimental_local_results(value)
        ):
            axis = None
        reporting = (
            reporting_unreachable_peers(self)
            if tf.executing_eagerly()
            else contextlib.nullcontext()
        )
        with reporting, self.extended._options_for_call(options):
            return super().reduce(reduce_op, value, axis)

    @contextlib.contextmanager
    def reducing_with(self, cross_device_ops: Any) -> Iterator[None]:
        """Steps traced inside reduce with `cross_device_ops`.

        Every reduction of the strategy's replicas (the optimizer's
        all-reduce, `ReplicaContext.all_reduce`, `strategy.reduce`) in a
        function traced inside the block goes to `cross_device_ops`
        instead of the strategy's own: one of the package's collective
        classes (a copy bound to this strategy's workers and devices, as
        the constructor's; its state, PowerSGD's for example, apart from
        the strategy's), or any `tf.distribute.CrossDeviceOps` as it is
        (one that reduces among this worker's devices alone, say). Only
        tracing reads it: a `tf.function` keeps what it was traced with,
        so trace each choice in a function of its own. Local SGD and
        DiLoCo (`tf_crossdevice.training`) use it for their inner steps
        and their syncs.

        >>> strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        ...     local_devices=["/cpu:0", "/cpu:1"])
        >>> one_device = tf_crossdevice.ReductionToOneDevice()
        >>> @tf.function
        ... def step():
        ...     ctx = tf.distribute.get_replica_context()
        ...     return ctx.all_reduce("sum", ctx.replica_id_in_sync_group + 1)
        >>> with strategy.reducing_with(one_device):
        ...     sums = strategy.experimental_local_results(strategy.run(step))
        >>> [int(v) for v in sums]
        [3, 3]

        Raises:
            TypeError: `cross_device_ops` is not a CrossDeviceOps.
        """
        with self.extended._reducing_with(cross_device_ops):
            yield


class _Extended(_TFExtended):  # type: ignore[misc,valid-type]
    """TensorFlow's extended object, with our ops, devices and start-up."""

    # enable_collectives started the server: TensorFlow must not configure
    # collectives, a coordination service or a server again, nor start its
    # health-check thread (whose first check waits for peers unbounded).
    _local_or_standalone_client_mode = True
    _enable_check_health = False

    def __init__(self, container, resolver, options, devices, ops, host):
        self._our_devices = tuple(devices)
        self._call_options: list[Options | None] = []
        # The first replica's initial value of the variable being created.
        self._first_initial_value = None
        # Made on first use: the workers' cardinalities meet there.
        self._cardinality_group: Group | None = None
        # reducing_with's bound copies of collective classes, by id.
        self._bound_ops: dict[int, tuple[Any, Any]] = {}
        super().__init__(container, resolver, options)
        self._cross_device_ops = ops
        self._host_cross_device_ops = host
        self._collective_keys = ops.reducer.keys

    def _initialize_local_devices(self, cluster_resolver, worker_device):
        kind = devices_lib.parse_device(self._our_devices[0])
        return self._our_devices, kind.device_type or "CPU"

    @contextlib.contextmanager
    def _options_for_call(self, options: Options | None) -> Iterator[None]:
        """`strategy.reduce`'s options, for `_reduce_to` below it."""
        self._call_options.append(options)
        try:
            yield
        finally:
            self._call_options.pop()

    @contextlib.contextmanager
    def _reducing_with(self, ops: Any) -> Iterator[None]:
        if _collective_reducer(ops) is not None:
            # One bound copy per object: it keeps its traced functions and
            # groups, and the original stays alive beside it.
            if id(ops) not in self._bound_ops:
                self._bound_ops[id(ops)] = (
                    ops,
                    _bound(
                        ops,
                        self._our_devices,
                        self._num_workers,
                        self._communication_options,
                    ),
                )
            ops = self._bound_ops[id(ops)][1]
        elif not isinstance(ops, tf.distribute.CrossDeviceOps):
            raise TypeError(
                "cross_device_ops: expected a tf.distribute.CrossDeviceOps "
                f"(a class of tf_crossdevice, say), got {type(ops).__name__}"
            )
        saved = self._cross_device_ops
        self._cross_device_ops = ops
        try:
            yield
        finally:
            self._cross_device_ops = saved

    def _reduce_to(self, reduce_op, value, destinations, options):
        for extra in self._call_options:
            options = values.check_options(options).merge(extra)
        return super()._reduce_to(reduce_op, value, destinations, options)

    def _experimental_distribute_dataset(self, dataset, options):
        return self._agree_on_cardinality(
            super()._experimental_distribute_dataset(dataset, options)
        )

    def _distribute_datasets_from_function(self, dataset_fn, options):
        return self._agree_on_cardinality(
            super()._distribute_datasets_from_function(dataset_fn, options)
        )

    def _agree_on_cardinality(self, distributed: Any) -> Any:
        """`distributed`, whose cardinality (batches) is the job's.

        TensorFlow gives a distributed dataset its worker's own cardinality,
        and Keras's `fit` runs that many steps: a worker with less data
        would leave the step loop early while the others wait for it in
        the step's collectives. Its iterator hands out empty batches until
        no worker has data left, so the job runs as many steps as the
        worker with most batches: every worker takes that number (UNKNOWN
        when one of them does not know its own, and Keras then iterates up
        to the end of the data, which the iterator signals on every worker
        at the same step).

        Raises:
            ValueError: some workers' data is infinite and others' is not
                (the iterators would run different collectives).
        """
        if self._num_workers == 1 or not tf.executing_eagerly():
            # In a function TensorFlow leaves the cardinality UNKNOWN.
            return distributed
        if self._cardinality_group is None:
            # One member per worker: its first device.
            first = self._host_cross_device_ops.reducer.local_devices[0]
            self._cardinality_group = Group(
                self._collective_keys, [first], self._num_workers, "cardinality"
            )
        own = int(distributed.cardinality)
        every = [
            int(c)
            for c in self._cardinality_group.all_gather(
                0, tf.constant([own], tf.int64), self._communication_options
            ).numpy()
        ]
        if len(set(every)) == 1:
            return distributed
        infinite = int(tf.data.INFINITE_CARDINALITY)
        if infinite in every:
            raise ValueError(
                "the workers' datasets disagree: infinite on some, not on "
                f"others (cardinality by task: {every}); every worker's "
                "data must be infinite, or none"
            )
        if min(every) < 0:  # tf.data.UNKNOWN_CARDINALITY on some worker
            agreed = int(tf.data.UNKNOWN_CARDINALITY)
        else:
            agreed = max(every)
        # TensorFlow 2.21's DistributedDataset and
        # DistributedDatasetsFromFunction keep it here, read by their
        # `cardinality` property and handed to each iterator they make.
        distributed._cardinality = agreed
        return distributed

    def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
        if isinstance(self._cross_device_ops, CollectiveAllReduce):
            return super()._replica_ctx_all_reduce(reduce_op, value, options)
        # The hierarchical variant needs every local replica's value at once.
        # TensorFlow's generic path: merge_call, then batch_reduce.
        return tf.distribute.StrategyExtended._replica_ctx_all_reduce(
            self, reduce_op, value, options
        )

    def _get_variable_creator_initial_value(
        self, replica_id, device, primary_var, **kwargs
    ):
        if replica_id != 0:
            # Inside a tf.function, a copy of the first replica's initial
            # value rather than (as TensorFlow's MirroredStrategy does) of
            # its variable, which the function creates: tf.function cannot
            # lift a read of it out of the function, and falls back to
            # initializing inside a conditional branch on the first call,
            # where the instance keys of the step's collectives, captured
            # at call time, are never fed.
            first = self._first_initial_value
            if (
                first is not None
                and first.graph is tf.compat.v1.get_default_graph()
            ):
                return lambda: _copy_to(first, device)
        if replica_id == 0 and self._num_workers > 1:
            make = self._broadcast_initial_value(device, **kwargs)
        else:
            make = super()._get_variable_creator_initial_value(
                replica_id=replica_id,
                device=device,
                primary_var=primary_var,
                **kwargs,
            )
        if replica_id != 0:
            return make

        def initial_value_fn() -> Any:
            value = make() if callable(make) else make
            first = getattr(value, "wrapped_value", value)
            self._first_initial_value = (
                None if tf.executing_eagerly() else tf.convert_to_tensor(first)
            )
            return value

        return initial_value_fn

    def _broadcast_initial_value(self, device: str, **kwargs) -> Any:
        """The chief's initial value, on every worker's first replica."""
        group = Group(
            self._collective_keys, [device], self._num_workers, "init"
        )
        options = self._communication_options
        chief = self._is_chief

        def broadcast() -> tf.Tensor:
            with tf.device(device):
                value = kwargs["initial_value"]
                if callable(value):
                    value = value()
                value = getattr(value, "wrapped_value", value)
                value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
                return group.broadcast(0, value, chief, options)

        return broadcast


def _copy_to(value: tf.Tensor, device: str) -> tf.Tensor:
    with tf.device(device):
        return tf.identity(value)


def _local_devices(
    local_devices: Sequence[str] | None,
    cluster: collective_runtime.CollectiveCluster,
    ops: CrossDeviceOpsAdapter,
) -> list[str]:
    prefix = cluster.worker_device
    if local_devices is None:
        gpus = len(tf.config.list_logical_devices("GPU"))
        wanted = getattr(ops, "num_gpus_per_worker", 0) or gpus
        if wanted > gpus:
            raise ValueError(
                f"cross_device_ops: num_gpus_per_worker={wanted} but this "
                f"worker has {gpus} GPU(s)"
            )
        if wanted:
            return [f"{prefix}/device:GPU:{i}" for i in range(wanted)]
        return [f"{prefix}/device:CPU:0"]
    names = _checks.string_list(local_devices, "local_devices", "device string")
    out = []
    for i, name in enumerate(names):
        parsed = devices_lib.parse_device(
            values.canonical_device(name, f"local_devices[{i}]")
        )
        if parsed.device_type is None:
            raise ValueError(
                f"local_devices[{i}]: {name!r} names no device; expected "
                "one such as '/cpu:1' or '/gpu:0'"
            )
        out.append(
            f"{prefix}/device:{parsed.device_type}:{parsed.device_index or 0}"
        )
    if len(set(out)) != len(out):
        raise ValueError(f"local_devices: a device is listed twice: {names}")
    values.check_devices_exist(out, "local_devices")
    return out


def _bound(
    ops: CrossDeviceOpsAdapter,
    devices: Sequence[str],
    num_workers: int,
    options: Options,
) -> CrossDeviceOpsAdapter:
    """A copy of a collective class bound to this worker's devices."""
    reducer = _collective_reducer(ops)
    assert reducer is not None  # The constructor checked the class.
    return ops.with_reducer(reducer.bound(devices, num_workers, options))


def _collective_reducer(cross_device_ops: Any) -> CollectiveReducer | None:
    """The collective reducer of one of our collective classes, else None."""
    if isinstance(cross_device_ops, CrossDeviceOpsAdapter) and isinstance(
        cross_device_ops.reducer, CollectiveReducer
    ):
        return cross_device_ops.reducer
    return None
