"""Times every candidate on one process's logical CPU devices.

For one workload and device count the entries are the candidates, the
rooflines (`tf.add_n` of the replicas' flat buffers on one device, the same
over one piece per core, numpy in one thread and one per core), a bound
(packing and unpacking alone) and two baselines: "inputs only" (cuts the
inputs and sinks them; subtracted from candidates) and "flat buffers only"
(subtracted from the TensorFlow rooflines). Each group runs in a fresh
process (`run_in_child`), so its memory and any crash stay there.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from benchmarks import candidates as candidates_lib
from benchmarks import processes, records, roofline, targets
from benchmarks import workloads as workloads_lib
from tf_crossdevice import _measure, testing

INPUTS_BASELINE = "baseline: inputs only"
FLAT_BASELINE = "baseline: flat buffers only"
ROOFLINE_ADD_N = "roofline: tf.add_n"
ROOFLINE_ADD_N_PER_CORE = "roofline: tf.add_n per core"
ROOFLINE_NUMPY = "roofline: numpy"
ROOFLINE_NUMPY_PER_CORE = "roofline: numpy per core"
PACK_UNPACK_BOUND = "bound: pack + unpack on each device, no transfer or sum"
_FIXED = (
    (INPUTS_BASELINE, "baseline", None),
    (FLAT_BASELINE, "baseline", None),
    (ROOFLINE_ADD_N, "roofline", FLAT_BASELINE),
    (ROOFLINE_ADD_N_PER_CORE, "roofline", FLAT_BASELINE),
    (ROOFLINE_NUMPY, "roofline", None),
    (ROOFLINE_NUMPY_PER_CORE, "roofline", None),
)
Built = tuple[Callable[[], Any], Callable[[], "str | None"]]


@dataclasses.dataclass
class Config:
    """How long and how carefully to time (see the flags of __main__)."""

    rounds: int = 7
    target_seconds: float = 0.1
    max_reps: int = 200
    warmup: int = 2
    seed: int = 0
    cores: int = 2


def estimated_peak_bytes(workload: workloads_lib.Workload, n: int) -> int:
    """About a group's peak memory: 0.6 GB + 5 n times the workload's bytes.

    Measured with every candidate on this repository's machine (inputs,
    results, intermediates, numpy's buffers, what allocators keep).
    """
    return int(0.6e9 + 5 * n * workload.num_bytes)


def run(
    workload: workloads_lib.Workload,
    num_devices: int,
    candidates: Sequence[candidates_lib.Candidate],
    config: Config,
    describe: Callable[[str], object] = lambda s: None,
) -> records.Group:
    """Verifies and times `candidates` on `num_devices` logical CPU devices.

    >>> r1d = candidates_lib.Candidate("TF r1d", "tf", "tf_r1d")
    >>> group = run(workloads_lib.single_tensor(64), 2, [r1d],
    ...             Config(rounds=1, target_seconds=0.001, warmup=1))
    >>> [(r.name, r.timing.verified) for r in group.results][-1]
    ('TF r1d', True)
    """
    devices = testing.cpu_devices(num_devices)
    inputs = _measure.Inputs(workload.gradients, devices, config.seed)
    entries: list[tuple[str, str, str | None, Any]]
    entries = [(n, f, b, None) for n, f, b in _FIXED]
    if workload.num_tensors > 1:
        entries.append((PACK_UNPACK_BOUND, "bound", INPUTS_BASELINE, None))
    entries += [(c.name, c.family, INPUTS_BASELINE, c) for c in candidates]
    closers: list[Callable[[], None]] = []
    prepared, timers = {}, {}
    for name, family, _, candidate in entries:
        describe(f"{workload.name} x{num_devices}: {name}")
        prepared[name], call = _measure.prepare(
            functools.partial(
                _build, name, candidate, inputs, config.cores, closers
            ),
            config.warmup,
            verifies=family != "baseline",
        )
        if call is not None:
            timers[name] = _measure.timer(call)
    describe(f"{workload.name} x{num_devices}: timing {len(timers)} entries")
    group = records.timed_group(
        records.Group.of("single_process", workload, num_devices),
        [e[:3] for e in entries],
        prepared,
        timers,
        config,
        targets.REFERENCES,
    )
    for close in closers:
        close()
    return group


def _build(
    name: str,
    candidate: candidates_lib.Candidate | None,
    inputs: _measure.Inputs,
    cores: int,
    closers: list[Callable[[], None]],
) -> Built:
    """The entry's timed call and its check."""
    (expected,) = inputs.expected_flats.values()

    def step(body: Callable[[], _measure.Results], check: Any) -> Built:
        s = _measure.Step(body)
        return s.timed, lambda: s.verify(check) if check else None

    def flat_check(results: _measure.Results, _: Any) -> str | None:
        got = np.concatenate([np.asarray(t) for t in results[0]])
        return _measure.mismatch(got, expected)

    if candidate is not None:
        ops = candidates_lib.build(candidate, inputs.devices)
        return step(_measure.all_reduce_body(ops, inputs), inputs.check)
    if name == INPUTS_BASELINE:
        body = lambda: [list(v.values) for v in inputs.values()]  # noqa: E731
        return step(body, inputs.check_inputs)
    if name == FLAT_BASELINE:
        return step(lambda: [inputs.flats()], None)
    if name == PACK_UNPACK_BOUND:
        return step(lambda: _pack_unpack(inputs), inputs.check_inputs)
    if name == ROOFLINE_ADD_N:
        return step(lambda: _add_n(inputs, 1), flat_check)
    if name == ROOFLINE_ADD_N_PER_CORE:
        return step(lambda: _add_n(inputs, cores), flat_check)
    arrays = [
        np.asarray(next(iter(v.values())).value()) for v in inputs.variables
    ]
    summer = roofline.NumpySum(arrays, 1 if name == ROOFLINE_NUMPY else cores)
    closers.append(summer.close)

    def check() -> str | None:
        summer()
        return _measure.mismatch(summer.out, expected)

    return summer, check


def _add_n(inputs: _measure.Inputs, pieces: int) -> _measure.Results:
    """n-way sum of the flat buffers, one piece per core on its own device."""
    flats = inputs.flats()
    sizes = roofline.aligned_pieces(flats[0].shape[0], pieces, 16)
    split = []
    for flat, device in zip(flats, inputs.devices, strict=True):
        with tf.device(device):
            split.append(tf.split(flat, sizes) if len(sizes) > 1 else [flat])
    sums = []
    for c in range(len(sizes)):
        with tf.device(inputs.devices[c % len(inputs.devices)]):
            sums.append(tf.add_n([s[c] for s in split]))
    return [sums]


def _pack_unpack(inputs: _measure.Inputs) -> _measure.Results:
    """Each device concatenates its tensors and splits them back (a bound:
    the packing work every packing algorithm does, without transfer or sum)."""
    per_device = []
    for i, device in enumerate(inputs.devices):
        tensors = inputs.tensors(i)
        with tf.device(device):
            packed = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
            pieces = tf.split(packed, [int(np.prod(t.shape)) for t in tensors])
            per_device.append(
                [
                    tf.reshape(p, t.shape)
                    for p, t in zip(pieces, tensors, strict=True)
                ]
            )
    return [list(column) for column in zip(*per_device, strict=True)]


# ---- One group in a process of its own ----------------------------------


def run_in_child(
    workload: workloads_lib.Workload,
    num_devices: int,
    candidates: Sequence[candidates_lib.Candidate],
    config: Config,
    describe: Callable[[str], object] = lambda s: None,
    timeout_seconds: float = 900.0,
) -> records.Group:
    """`run` in a fresh process with `num_devices` logical CPU devices.

    `timeout_seconds` bounds the child's silence (it reports after every
    entry it builds, and after the rounds).

    Raises:
        processes.ChildError: the child died, failed or went silent.
    """
    child = processes.Child(
        f"{workload.name} x{num_devices}",
        processes.module_argv("benchmarks.single_process"),
        processes.child_env({}),
    )
    try:
        child.send(
            {
                "workload": dataclasses.asdict(workload),
                "num_devices": num_devices,
                "candidates": [dataclasses.asdict(c) for c in candidates],
                "config": dataclasses.asdict(config),
            }
        )
        while True:
            message = child.receive(timeout_seconds)
            if "describe" in message:
                describe(message["describe"])
            elif "group" in message:
                return records.Group.from_dict(message["group"])
            else:
                raise processes.ChildError(f"{child.name}: {message['error']}")
    finally:
        child.stop()


def _peak_rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _child_main(argv: list[str]) -> int:
    job = processes.child_start(argv)
    if job is None:
        return 0
    try:
        testing.request_cpu_devices(job["num_devices"])
        w = job["workload"]
        group = run(
            workloads_lib.Workload(
                w["name"], tuple(map(tuple, w["shapes"])), w["description"]
            ),
            job["num_devices"],
            [candidates_lib.Candidate(**c) for c in job["candidates"]],
            Config(**job["config"]),
            describe=lambda text: processes.reply({"describe": text}),
        )
    except Exception as e:  # noqa: BLE001 - sent to the parent.
        error = f"{type(e).__name__}: {_measure.first_line(str(e))}"
        processes.reply({"error": error})
        return 1
    group.peak_rss_bytes = _peak_rss_bytes()
    processes.reply({"group": dataclasses.asdict(group)})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
