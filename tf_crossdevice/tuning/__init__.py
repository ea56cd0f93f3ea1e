"""Choosing a CrossDeviceOps: candidates, measuring, autotune, cost model.

`select_cross_device_ops` picks the class that suits a list of devices:
autotune's cached choice, else the cost model's recommendation, else a
rule for the devices. `autotune` measures candidate configurations (a
selection from the one list of configurations the cost model prices)
and returns the fastest. `measure` times all-reduce steps against
numpy-checked inputs; `cost_model` predicts from link constants.
"""

from tf_crossdevice.tuning import cost_model, measure
from tf_crossdevice.tuning._autotune import autotune
from tf_crossdevice.tuning._selection import select_cross_device_ops

__all__ = ["autotune", "cost_model", "measure", "select_cross_device_ops"]
