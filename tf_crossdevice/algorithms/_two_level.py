"""Two-level all-reduce: within each worker, then across workers.

TensorFlow 1's hierarchical algorithms ('nccl/xring', 'pscpu/pscpu', ...)
compose two all-reduces. The inner one sums the tensors of each worker; the
first member of each group (its representative) takes part in the outer
one, across workers; each representative then copies the global sum to the
other members of its group. Only one tensor per worker crosses workers in
each direction of the outer all-reduce; everything else stays inside a
worker.

Example: four logical CPUs posing as two workers of two devices each, with
a shuffle all-reduce inside and across the workers:

>>> from tf_crossdevice.algorithms._shuffle import shuffle_all_reduce
>>> from tf_crossdevice.algorithms._two_level import two_level_all_reduce
>>> cpus = tf_crossdevice.testing.cpu_devices(4)
>>> tensors = []
>>> for i, d in enumerate(cpus):
...     with tf.device(d):
...         tensors.append(tf.fill([2], float(i + 1)))
>>> def pscpu(ts, index):
...     return shuffle_all_reduce(ts, [ts[0].device])
>>> sums = two_level_all_reduce(tensors, [[0, 1], [2, 3]], pscpu, pscpu)
>>> [s.numpy().tolist() for s in sums]
[[10.0, 10.0], [10.0, 10.0], [10.0, 10.0], [10.0, 10.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias

import tensorflow as tf

from tf_crossdevice import compression as wire_policy
from tf_crossdevice._core import checks, workers
from tf_crossdevice.algorithms import _flat
from tf_crossdevice.algorithms import _protocol as protocol

GroupDevices: TypeAlias = Callable[[Sequence[str]], Sequence[Sequence[int]]]


def check_groups(
    groups: Sequence[Sequence[int]], num_tensors: int
) -> list[list[int]]:
    """Checks that `groups` partitions the positions `0 .. num_tensors-1`.

    Args:
        groups: positions of tensors, one non-empty list per worker.
        num_tensors: how many tensors there are.

    Returns:
        `groups` as lists of ints.

    Raises:
        TypeError: `groups` is not a sequence of sequences of ints.
        ValueError: a group is empty, or a position is out of range, repeated
            or missing.

    >>> check_groups([[0, 2], [1]], 3)
    [[0, 2], [1]]
    >>> check_groups([[0], [0, 1]], 2)
    Traceback (most recent call last):
    ...
    ValueError: groups: position 0 is in more than one group in [[0], [0, 1]]; expected each of 0..1 in exactly one group
    """  # noqa: E501
    if not isinstance(groups, Sequence) or isinstance(groups, str):
        raise TypeError(
            "groups: expected a list of lists of tensor positions, got "
            f"{type(groups).__name__} {groups!r}"
        )
    allowed = f"expected each of 0..{num_tensors - 1} in exactly one group"
    seen: set[int] = set()
    result = []
    for g, group in enumerate(groups):
        if not isinstance(group, Sequence) or isinstance(group, str):
            raise TypeError(
                f"groups[{g}]: expected a list of tensor positions, got "
                f"{type(group).__name__} {group!r}"
            )
        if not group:
            raise ValueError(f"groups[{g}] is empty in {groups!r}; {allowed}")
        for j, i in enumerate(group):
            checks.integer(i, f"groups[{g}][{j}]")
            if not 0 <= i < num_tensors:
                raise ValueError(
                    f"groups: position {i} is out of range in {groups!r}; "
                    f"{allowed}"
                )
            if i in seen:
                raise ValueError(
                    f"groups: position {i} is in more than one group in "
                    f"{groups!r}; {allowed}"
                )
            seen.add(i)
        result.append(list(group))
    if len(seen) != num_tensors:
        missing = sorted(set(range(num_tensors)) - seen)
        raise ValueError(
            f"groups: positions {missing} are in no group in {groups!r}; "
            f"{allowed}"
        )
    return result


def _call(
    name: str,
    all_reduce: protocol.AllReduceBuilder,
    tensors: list[tf.Tensor],
    index: int,
):
    results = list(all_reduce(tensors, index))
    if len(results) != len(tensors):
        raise ValueError(
            f"{name}: an all-reduce must return one tensor per input; it got "
            f"{len(tensors)} and returned {len(results)}"
        )
    return results


# Plain Python over a static schedule: autograph would only slow tracing.
@tf.autograph.experimental.do_not_convert
def two_level_all_reduce(
    tensors: Sequence[tf.Tensor],
    groups: Sequence[Sequence[int]],
    inner: protocol.AllReduceBuilder,
    outer: protocol.AllReduceBuilder,
    index: int = 0,
) -> list[tf.Tensor]:
    """Sums `tensors` with `inner` inside each group and `outer` across them.

    1. `inner` all-reduces the tensors of each group with more than one
       member (a group of one is its own sum).
    2. `outer` all-reduces one tensor per group: the inner sum on the
       group's first member, the representative. It is skipped for a single
       group.
    3. Each member other than the representative copies the global sum from
       its representative onto its own device.

    Args:
        tensors: one dense tensor per device, all of one shape and dtype.
        groups: positions into `tensors`, one list per worker, e.g. from
            `tf_crossdevice._core.workers.group_by_worker`; every
            position in exactly one group. Tests pass fake groups of local
            devices.
        inner: the builder within a worker (see `protocol`): takes a list
            of tensors and the index, returns their sums, the i-th on the
            i-th input's device.
        outer: the builder across workers, with the same contract.
        index: the value's index in its batch, passed to both.

    Returns:
        The sums: element i is on `tensors[i].device` with the shape and
        dtype of `tensors[i]`.

    Raises:
        TypeError: `tensors` are not dense tensors of one supported dtype,
            `groups` is not a list of lists of ints, or `inner` / `outer`
            is not callable.
        ValueError: `tensors` is empty or shapes differ, `groups` does not
            partition the positions of `tensors`, or `inner` / `outer`
            returned the wrong number of tensors.
    """
    tensors = _flat.check_inputs(tensors, num_shards=1)
    groups = check_groups(groups, len(tensors))
    for name, fn in (("inner", inner), ("outer", outer)):
        if not callable(fn):
            raise TypeError(
                f"{name}: expected a callable all-reduce, got "
                f"{type(fn).__name__} {fn!r}"
            )

    # A group of one is its own inner sum.
    inner_sums = list(tensors)
    for group in groups:
        if len(group) > 1:
            sums = _call("inner", inner, [tensors[i] for i in group], index)
            for i, s in zip(group, sums, strict=True):
                inner_sums[i] = s
    if len(groups) == 1:
        if len(tensors) == 1:  # Return a new tensor, as an all-reduce does.
            with tf.device(tensors[0].device):
                return [tf.identity(tensors[0])]
        return inner_sums

    representatives = [inner_sums[group[0]] for group in groups]
    global_sums = _call("outer", outer, representatives, index)
    outputs = list(inner_sums)
    for group, global_sum in zip(groups, global_sums, strict=True):
        outputs[group[0]] = global_sum
        for i in group[1:]:
            with tf.device(tensors[i].device):
                outputs[i] = tf.identity(global_sum)
    return outputs


def group_by(same_worker: wire_policy.SameWorker) -> GroupDevices:
    """A `GroupDevices` from a "same worker?" predicate.

    >>> group_by(lambda a, b: a[-1] == b[-1])(["x0", "y1", "z0"])
    [[0, 2], [1]]
    """

    def grouping(devices: Sequence[str]) -> list[list[int]]:
        groups: list[list[int]] = []
        for i, device in enumerate(devices):
            for group in groups:
                if same_worker(devices[group[0]], device):
                    group.append(i)
                    break
            else:
                groups.append([i])
        return groups

    return grouping


def builder(
    inner: protocol.AllReduceBuilder,
    outer: protocol.AllReduceBuilder,
    group_devices: GroupDevices | None = None,
    *,
    wire: wire_policy.WirePolicy | None = None,
) -> protocol.AllReduceBuilder:
    """The two-level builder the registry makes for 'inner/outer' names.

    Args:
        inner: the builder within each worker.
        outer: the builder across one representative per worker (the one
            that compresses, when the registry builds it with a codec).
        group_devices: the tensors' devices -> positions per worker; default
            `group_by(wire.same_worker)` if the policy has its own
            `same_worker`, else `workers.group_by_worker` (by job, replica
            and task). Tests pass fake workers made of local devices.
        wire: the `tf_crossdevice.compression.WirePolicy` whose links say
            which devices share a worker (see `group_devices`); only its
            `same_worker` is read here.
    """
    links = wire_policy.check_wire(wire).same_worker
    grouping: GroupDevices
    if group_devices is not None:
        grouping = group_devices
    elif links is not wire_policy.default_same_worker:
        grouping = group_by(links)
    else:
        grouping = workers.group_by_worker

    def two_level(tensors: Sequence[tf.Tensor], index: int) -> list[tf.Tensor]:
        tensors = _flat.check_inputs(tensors, num_shards=1)
        groups = grouping([t.device for t in tensors])
        return two_level_all_reduce(tensors, groups, inner, outer, index)

    return two_level
