"""Choosing a CrossDeviceOps: candidates, measuring, autotune, cost model.

`measure` times all-reduce steps against numpy-checked inputs;
`cost_model` predicts from link constants and prices `_grid`, the one
list of configurations. Autotune is built from `_topology` (where the
replicas are, what is reduced), `_configs` (the one `(class name, kwargs)`
codec and `make_ops`), `_candidates` (the selection from `_grid` it
times), `_cache` and `_results`; `_autotune` is the search itself, and
`_selection` picks from a cached choice, the cost model or the device rule.

May import: everything below it (`_core`, `compression`, `packing`,
`algorithms`, `ops`, `collective`, `cluster`).
"""

from tf_crossdevice.tuning import cost_model, measure
from tf_crossdevice.tuning._autotune import autotune
from tf_crossdevice.tuning._selection import select_cross_device_ops

__all__ = ["autotune", "cost_model", "measure", "select_cross_device_ops"]
