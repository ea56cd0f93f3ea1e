"""Shard layout for the shuffle all-reduce (pscpu / psgpu).

Pure Python; no TensorFlow.

Each device's tensor is flattened and cut into `num_shards` contiguous
shards; shard j is summed on gather device `j % num_gather_devices`. Shard
sizes differ by at most one element (the first `num_elements % num_shards`
shards get the extra one), so no padding is sent; shards with no elements
are left out.

>>> from tf_crossdevice.algorithms import _shuffle_schedule as shuffle
>>> shuffle.shard_sizes(10, 4)
[3, 3, 2, 2]
>>> shuffle.shard_gather_devices(4, 3)
[0, 1, 2, 0]
"""

from __future__ import annotations

from tf_crossdevice._core import checks


def shard_sizes(num_elements: int, num_shards: int) -> list[int]:
    """Element counts of the `num_shards` contiguous shards of a tensor.

    Args:
        num_elements: the tensor's element count, at least 0.
        num_shards: how many shards, at least 1.

    Returns:
        `num_shards` counts that sum to `num_elements` and differ by at most
        one, larger first. Some are 0 when `num_elements < num_shards`.

    Raises:
        ValueError: an argument is not an integer in range.

    >>> shard_sizes(7, 3)
    [3, 2, 2]
    >>> shard_sizes(2, 3)
    [1, 1, 0]
    """
    checks.non_negative_int(num_elements, "num_elements")
    checks.positive_int(num_shards, "num_shards")
    base, extra = divmod(num_elements, num_shards)
    return [base + 1] * extra + [base] * (num_shards - extra)


def shard_gather_devices(num_shards: int, num_gather_devices: int) -> list[int]:
    """Which gather device sums each shard: shard j goes to j % count.

    Args:
        num_shards: how many shards, at least 1.
        num_gather_devices: how many gather devices, at least 1.

    Returns:
        For each shard, the position of its gather device.

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range.

    >>> shard_gather_devices(3, 2)
    [0, 1, 0]
    """
    checks.positive_int(num_shards, "num_shards")
    checks.positive_int(num_gather_devices, "num_gather_devices")
    return [j % num_gather_devices for j in range(num_shards)]
