"""Link topologies (pure Python): is a GPU link matrix DGX-1-like?"""

from __future__ import annotations

from collections.abc import Sequence

LinkMatrix = Sequence[Sequence[bool | int]]


def check_link_matrix(link_matrix: LinkMatrix, num_devices: int) -> None:
    """Raises ValueError unless `link_matrix` is `num_devices` x `num_devices`.

    >>> check_link_matrix([[0, 1], [1, 0]], 2)
    >>> check_link_matrix([[0, 1]], 2)
    Traceback (most recent call last):
    ...
    ValueError: link_matrix: expected 2 rows (one per device), got 1
    """
    rows = list(link_matrix)
    if len(rows) != num_devices:
        raise ValueError(
            f"link_matrix: expected {num_devices} rows (one per device), "
            f"got {len(rows)}"
        )
    for i, row in enumerate(rows):
        if len(row) != num_devices:
            raise ValueError(
                f"link_matrix: row {i} has {len(row)} entries, expected "
                f"{num_devices}"
            )


def dgx1_link_matrix() -> list[list[bool]]:
    """The DGX-1 (P100/V100) hybrid cube-mesh among 8 GPUs.

    GPUs 0-3 and 4-7 are each fully connected, and GPU i links to GPU i+4.
    """
    links = [[False] * 8 for _ in range(8)]
    for i in range(8):
        for j in range(8):
            same_quad = (i < 4) == (j < 4)
            if i != j and (same_quad or abs(i - j) == 4):
                links[i][j] = True
    return links


def is_dgx1_like(link_matrix: LinkMatrix) -> bool:
    """True when 8 devices have at least the DGX-1's links.

    Extra links (a fully connected NVSwitch machine) still count: the
    hierarchical copy runs well there too.

    >>> is_dgx1_like(dgx1_link_matrix())
    True
    >>> is_dgx1_like([[False] * 8 for _ in range(8)])
    False
    >>> is_dgx1_like([[True] * 4 for _ in range(4)])
    False
    """
    rows = [list(row) for row in link_matrix]
    if len(rows) != 8 or any(len(row) != 8 for row in rows):
        return False
    need = dgx1_link_matrix()
    return all(
        bool(rows[i][j]) or not need[i][j] for i in range(8) for j in range(8)
    )
