"""The cost model's solver: non-negative least squares on scaled columns.

Every fit of the constants comes here (`Constants.fitted`, and through it
`cost_model.fit`): a count per constant and step, times the constants,
against each step's seconds, with no constant below 0. A column counts
messages, another bytes, so their sizes are orders of magnitude apart;
each is scaled to unit norm before SciPy's Lawson-Hanson solver, so that
its tolerance means the same for every column, and the solution is scaled
back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray


def _scipy_nnls() -> Callable[..., Any]:
    try:
        # SciPy is optional (the `fit` extra): only fitting needs it.
        from scipy import optimize  # type: ignore[import-untyped]
    except ModuleNotFoundError as error:
        if error.name != "scipy":
            raise
        raise ImportError(
            "fitting the cost model needs SciPy: pip install scipy "
            "(from a checkout of tf_crossdevice: pip install -e '.[fit]')"
        ) from error
    return optimize.nnls


def nonnegative_least_squares(
    counts: ArrayLike, seconds: ArrayLike, *, relative: bool
) -> NDArray[np.float64]:
    """The `x >= 0` that minimises `|counts @ x - seconds|`.

    Args:
        counts: one row per step, a column per constant.
        seconds: each step's time.
        relative: minimise squared relative errors (each row divided by
            its seconds); else absolute errors.

    Raises:
        ImportError: SciPy is not installed.

    >>> nonnegative_least_squares([[1.0, 0.0], [0.0, 1.0]], [2.0, -1.0],
    ...                           relative=False)
    array([2., 0.])
    """
    a = np.asarray(counts, dtype=float)
    b = np.asarray(seconds, dtype=float)
    if not a.size:  # SciPy's solver crashes on an empty matrix
        return np.zeros(a.shape[1])
    if relative:
        a, b = a / b[:, None], np.ones_like(b)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    x, _ = _scipy_nnls()(a / scale, b)
    return x / scale
