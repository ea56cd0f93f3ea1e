"""Benchmark: our all-reduce algorithms against TensorFlow's, by numbers.

Run `python -m benchmarks` (`--quick` for a two-minute
version, `--helpfull` for every flag). It measures, in one run and on the
same tensors:

- workloads: ResNet-50's gradients, BERT-base's, 1000 small tensors, and a
  sweep of one tensor from 4 B to 256 MiB (`workloads.py`);
- settings: one process with 2, 4 and 8 logical CPU devices, and 2 and 3
  local worker processes (`single_process.py`, `multi_worker.py`);
- candidates: every algorithm and packing setting of ours that applies, and
  TensorFlow's built-ins (`candidates.py`);
- the roofline: the fastest plain sum of the same bytes, or the loopback
  transfer rate across processes (`roofline.py`).

Every result is checked against numpy before it is timed; candidates are
timed in interleaved rounds (`timing.py`). Outputs: an nccl-tests-style table
on stdout (also `results.txt`), `results.json` with every figure, and
`time_vs_size.png` (`report.py`).
"""
