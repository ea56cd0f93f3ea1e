"""The benchmark study: our all-reduce algorithms against TensorFlow's.

Not part of the installed package: run `python -m benchmarks` from a
checkout (`--quick` for a one-minute version, `--helpfull` for the flags).
It measures, in one run and on the same tensors, every workload
(`workloads.py`) in one process with 2, 4 and 8 logical CPU devices and
across 2 and 3 worker processes (`groups.py`, `sessions.py`),
every candidate of ours and TensorFlow's built-ins (`candidates.py`), and the
roofline (`roofline.py`). Checking against numpy and interleaved timing come
from the package's measuring core, `tf_crossdevice._measure`. Outputs: an
nccl-tests-style table, `results.json` (`records.py`), `results.md` and
`time_vs_size.png` (`report.py`), and the project's targets (`targets.py`).
"""
