"""Schedule of the hierarchical-copy all-reduce (pure Python).

TensorFlow 1 built this for the DGX-1: its 8 GPUs form two groups of four
with fast links inside each group. Per tensor, a main device (rotating over
all devices so the work spreads) sums its own group, a partner in the other
group sums that group, the two partial sums meet on the main device, and the
total flows back through the two group roots. TF 1 used `n // 2` for both
group sizes, which silently dropped the last device when `n` was odd; here
the first group has `ceil(n / 2)` devices and the second the rest, so every
device takes part for any `n >= 1`.
"""

from __future__ import annotations

import dataclasses

from tf_crossdevice._core import checks


@dataclasses.dataclass(frozen=True)
class HierarchicalCopyPlan:
    """Who sums what for one tensor.

    Attributes:
        main_group: device indices of the group that holds the main device.
        main_root: the main device; it sums `main_group` and the total.
        other_group: device indices of the other group (empty when n == 1).
        other_root: the device that sums `other_group` (None when empty).
    """

    main_group: tuple[int, ...]
    main_root: int
    other_group: tuple[int, ...]
    other_root: int | None

    def root_of(self, device: int) -> int:
        """The root a device copies the total from."""
        if device in self.main_group:
            return self.main_root
        if device in self.other_group and self.other_root is not None:
            return self.other_root
        raise ValueError(f"device: {device} is in neither group of {self}")


def split_groups(num_devices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The two device groups: `[0, ceil(n/2))` and `[ceil(n/2), n)`.

    >>> split_groups(8)
    ((0, 1, 2, 3), (4, 5, 6, 7))
    >>> split_groups(3)
    ((0, 1), (2,))
    """
    checks.positive_int(num_devices, "num_devices")
    half = (num_devices + 1) // 2
    return tuple(range(half)), tuple(range(half, num_devices))


def hierarchical_copy_plan(
    num_devices: int, tensor_index: int
) -> HierarchicalCopyPlan:
    """The plan for the `tensor_index`-th tensor on `num_devices` devices.

    The main device is `tensor_index % num_devices`. If it sits at position
    `p` of its group, the other group's root is that group's member at
    position `p % len(other_group)`, as on the DGX-1 (GPU i pairs with i+4).

    >>> hierarchical_copy_plan(8, 5)
    HierarchicalCopyPlan(main_group=(4, 5, 6, 7), main_root=5, \
other_group=(0, 1, 2, 3), other_root=1)
    >>> hierarchical_copy_plan(3, 2)
    HierarchicalCopyPlan(main_group=(2,), main_root=2, other_group=(0, 1), \
other_root=0)
    """
    first, second = split_groups(num_devices)
    checks.non_negative_int(tensor_index, "tensor_index")
    main = tensor_index % num_devices
    main_group, other_group = (
        (first, second) if main in first else (second, first)
    )
    if not other_group:
        return HierarchicalCopyPlan(main_group, main, (), None)
    position = main_group.index(main)
    other_root = other_group[position % len(other_group)]
    return HierarchicalCopyPlan(main_group, main, other_group, other_root)
