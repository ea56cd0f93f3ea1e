"""Choosing a CrossDeviceOps: candidates, measuring, autotune, cost model.

`measure` times all-reduce steps against numpy-checked inputs;
`_autotune` searches the candidates on the real devices; `cost_model`
predicts from link constants; `_selection` picks from devices and links.

May import: everything below it (`_core`, `compression`, `packing`,
`algorithms`, `ops`, `collective`, `cluster`).
"""

from tf_crossdevice.tuning import cost_model, measure
from tf_crossdevice.tuning._autotune import autotune
from tf_crossdevice.tuning._selection import select_cross_device_ops

__all__ = ["autotune", "cost_model", "measure", "select_cross_device_ops"]
