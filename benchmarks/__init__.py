"""The benchmark study: our all-reduce algorithms against TensorFlow's.

Not part of the installed package: run `python -m benchmarks` from a
checkout (`__main__.py` says what a run measures and writes). What is
reduced: `workloads.py`; by what: `candidates.py`; how: `groups.py` and
`sessions.py` (on `tf_crossdevice.tuning.measure` and `_processes`); against
what: `roofline.py`; what comes out: `records.py`, `report.py`, `targets.py`.
On GPUs: `gpu.py` (`python -m benchmarks.gpu`).
"""
