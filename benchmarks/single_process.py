"""Times every candidate on one process's logical CPU devices.

For one workload and device count, the entries are the candidates, the
rooflines (`tf.add_n` of the replicas' flat buffers on one device, the same
over one piece per core, numpy in one thread and in one thread per core) and
two baselines: "inputs only" (the step that cuts the inputs and sinks them,
subtracted from the candidates) and "flat buffers only" (reads the flat
buffers and sinks them, subtracted from the TensorFlow rooflines). Every
entry is verified against numpy, warmed up, and timed in interleaved rounds.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_crossdevice import _packing, testing
from benchmarks import candidates as candidates_lib
from benchmarks import (
    records,
    roofline,
    steps,
    processes,
    timing,
)
from benchmarks import workloads as workloads_lib

INPUTS_BASELINE = "baseline: inputs only"
FLAT_BASELINE = "baseline: flat buffers only"
ROOFLINE_ADD_N = "roofline: tf.add_n"
ROOFLINE_ADD_N_PER_CORE = "roofline: tf.add_n per core"
ROOFLINE_NUMPY = "roofline: numpy"
ROOFLINE_NUMPY_PER_CORE = "roofline: numpy per core"
# The many-small targets compare against these; the confirmation rounds
# re-time them with the best of each family (records.finalists).
TARGET_REFERENCES = (
    "TF ReductionToOneDevice",
    "TF HierarchicalCopy num_packs=1",
)
# Best ours, TF's and roofline, a bound, the references, two baselines.
MAX_FINALISTS = 8
# What every packing algorithm does on each device besides moving and
# summing: concatenate the tensors and split the result back into them.
PACK_UNPACK_BOUND = "bound: pack + unpack on each device, no transfer or sum"
# (name, family, baseline) of the entries every group has.
_FIXED_ENTRIES = (
    (INPUTS_BASELINE, "baseline", None),
    (FLAT_BASELINE, "baseline", None),
    (ROOFLINE_ADD_N, "roofline", FLAT_BASELINE),
    (ROOFLINE_ADD_N_PER_CORE, "roofline", FLAT_BASELINE),
    (ROOFLINE_NUMPY, "roofline", None),
    (ROOFLINE_NUMPY_PER_CORE, "roofline", None),
)


@dataclasses.dataclass
class Config:
    """How long and how carefully to time.

    Attributes:
        rounds: timing rounds (each entry once per round).
        target_seconds: each measurement repeats the step about this long.
        max_reps: at most this many steps per measurement.
        warmup: untimed calls after verification.
        seed: seeds the values and the round order.
        cores: pieces for the per-core rooflines.
    """

    rounds: int = 7
    target_seconds: float = 0.1
    max_reps: int = 200
    warmup: int = 2
    seed: int = 0
    cores: int = 2


def estimated_peak_bytes(workload: workloads_lib.Workload, n: int) -> int:
    """About how much memory a group's process needs at its peak.

    Measured with every candidate on this repository's machine (TF 2.21,
    one 64 MiB tensor): 0.6 GB plus 5 n times the workload's bytes (the
    inputs, every device's results, the algorithms' intermediates, numpy's
    buffers and what the allocators keep).

    >>> round(estimated_peak_bytes(workloads_lib.single_tensor(1 << 30), 4)
    ...       / 2**30, 1)
    20.6
    """
    return int(0.6e9 + 5 * n * workload.num_bytes)


def units(num_candidates: int, rounds: int, num_tensors: int = 1) -> int:
    """Progress units `run` reports for this many candidates.

    >>> units(3, 5), units(3, 5, num_tensors=2)
    (94, 100)
    """
    fixed = len(_FIXED_ENTRIES) + (num_tensors > 1)
    return (num_candidates + fixed) * (1 + rounds) + MAX_FINALISTS * rounds


def run(
    workload: workloads_lib.Workload,
    num_devices: int,
    candidates: Sequence[candidates_lib.Candidate],
    config: Config,
    advance: Callable[[int], object] = lambda n: None,
    describe: Callable[[str], object] = lambda s: None,
) -> dict[str, Any]:
    """Verifies and times `candidates` on `num_devices` logical CPU devices.

    Args:
        workload: the tensors each replica holds.
        num_devices: replicas, one per logical CPU device (the process must
            have that many; see `testing.request_cpu_devices`).
        candidates: what to compare.
        config: rounds and timing targets.
        advance: called with a count of finished progress units: one per
            entry prepared and one per measurement.
        describe: called with what is being done now.

    Returns:
        The group's record (see `records.make_group_record`).

    >>> r1d = candidates_lib.Candidate(
    ...     "TF ReductionToOneDevice", "tf", "tf_r1d")
    >>> group = run(workloads_lib.single_tensor(64), 2, [r1d],
    ...             Config(rounds=1, target_seconds=0.001, warmup=1))
    >>> [(r["name"], r["verified"]) for r in group["results"]][-1]
    ('TF ReductionToOneDevice', True)
    >>> len(group["results"][-1]["step_seconds"]["samples"])
    1
    """
    replicas = steps.Replicas(
        workload, testing.cpu_devices(num_devices), config.seed
    )
    entries: list[dict[str, Any]] = [
        {"name": name, "family": family, "baseline": baseline}
        for name, family, baseline in _FIXED_ENTRIES
    ]
    if workload.num_tensors > 1:
        entries.append(
            {
                "name": PACK_UNPACK_BOUND,
                "family": "bound",
                "baseline": INPUTS_BASELINE,
            }
        )
    entries += [
        {
            "name": c.name,
            "family": c.family,
            "baseline": INPUTS_BASELINE,
            "candidate": c.as_dict(),
        }
        for c in candidates
    ]
    calls: dict[str, Callable[[], Any]] = {}
    reps: dict[str, int] = {}
    closers: list[Callable[[], None]] = []
    for entry in entries:
        describe(f"{workload.name} x{num_devices}: {entry['name']}")
        build = _builder(entry, replicas, config.cores, closers)
        prepared, call = steps.prepare(
            build, config.warmup, verifies=entry["family"] != "baseline"
        )
        entry.update(prepared.as_dict())
        if call is not None:
            calls[entry["name"]] = call
            reps[entry["name"]] = timing.reps_for(
                prepared.seconds_per_call,
                config.target_seconds,
                config.max_reps,
            )
        entry["reps"] = reps.get(entry["name"], 0)
        advance(1)
    describe(f"{workload.name} x{num_devices}: timing {len(calls)} entries")
    samples, errors = timing.interleaved_rounds(
        {name: _timer(call) for name, call in calls.items()},
        reps,
        config.rounds,
        seed=config.seed,
        on_measurement=lambda name: advance(1),
    )
    advance((len(entries) - len(calls)) * config.rounds)
    records.attach_samples(entries, samples, errors)
    record = records.make_group_record(
        setting="single_process",
        workload=workload,
        num_replicas=num_devices,
        entries=entries,
        rounds=config.rounds,
    )
    names = [
        n
        for n in records.finalists(record, TARGET_REFERENCES)
        if n in calls and n not in errors
    ][:MAX_FINALISTS]
    describe(f"{workload.name} x{num_devices}: confirming {len(names)}")
    confirm, confirm_errors = timing.interleaved_rounds(
        {name: _timer(calls[name]) for name in names},
        reps,
        config.rounds,
        seed=config.seed + 1,
        on_measurement=lambda name: advance(1),
    )
    advance((MAX_FINALISTS - len(names)) * config.rounds)
    records.add_confirmation(record, confirm, confirm_errors)
    for close in closers:
        close()
    del replicas, calls
    gc.collect()
    return record


def _timer(call: Callable[[], Any]) -> timing.TimeFn:
    return lambda reps: timing.time_calls(call, reps)


Built = tuple[Callable[[], Any], Callable[[], "str | None"]]


def _builder(
    entry: dict[str, Any],
    replicas: steps.Replicas,
    cores: int,
    closers: list[Callable[[], None]],
) -> Callable[[], Built]:
    """A function that builds the entry: (timed call, check)."""
    name = entry["name"]

    def build() -> Built:
        if name == INPUTS_BASELINE:
            pair = steps.StepPair(
                lambda: [list(v.values) for v in replicas.values()]
            )
            return pair.timed, lambda: pair.verify(replicas.check_inputs)
        if name == FLAT_BASELINE:
            pair = steps.StepPair(lambda: [replicas.flats()])
            return pair.timed, lambda: None
        if entry["family"] == "roofline":
            return _build_roofline(name, replicas, cores, closers)
        if name == PACK_UNPACK_BOUND:
            pair = steps.StepPair(lambda: _pack_unpack(replicas))
            return pair.timed, lambda: pair.verify(replicas.check_inputs)
        candidate = candidates_lib.Candidate.from_dict(entry["candidate"])
        reduce_fn = candidates_lib.build(candidate, replicas.devices)

        def body() -> steps.Results:
            return [list(v.values) for v in reduce_fn(replicas.values())]

        pair = steps.StepPair(body)
        return pair.timed, lambda: pair.verify(replicas.check)

    return build


def _pack_unpack(replicas: steps.Replicas) -> steps.Results:
    """Each device's tensors packed into one buffer and unpacked (a bound).

    The library's own concat packer (num_packs=1), so the bound is exactly
    the packing work our packing algorithms do.
    """
    inputs = [replicas.tensors(i) for i in range(len(replicas.devices))]
    packer = _packing.make_packer(
        inputs[0],
        num_packs=1,
        agg_small_grads_max_bytes=0,
        agg_small_grads_max_group=0,
    )
    per_device = []
    for tensors, device in zip(inputs, replicas.devices, strict=True):
        with tf.device(device):
            per_device.append(packer.unpack(packer.pack(tensors)))
    return [list(column) for column in zip(*per_device, strict=True)]


def _build_roofline(
    name: str,
    replicas: steps.Replicas,
    cores: int,
    closers: list[Callable[[], None]],
) -> Built:
    expected = replicas.expected
    devices = replicas.devices
    if name == ROOFLINE_ADD_N:

        def add_n() -> steps.Results:
            flats = replicas.flats()
            with tf.device(devices[0]):
                return [[tf.add_n(flats)]]

        pair = steps.StepPair(add_n)
        return pair.timed, lambda: pair.verify(
            lambda results, _: steps.mismatch(
                np.asarray(results[0][0]), expected
            )
        )
    if name == ROOFLINE_ADD_N_PER_CORE:
        pieces = roofline.aligned_pieces(
            replicas.layout.total_elements, cores, workloads_lib.ALIGN_ELEMENTS
        )

        def add_n_per_core() -> steps.Results:
            split = []
            for flat, device in zip(replicas.flats(), devices, strict=True):
                with tf.device(device):
                    split.append(tf.split(flat, pieces))
            sums = []
            for c in range(len(pieces)):
                with tf.device(devices[c % len(devices)]):
                    sums.append(tf.add_n([s[c] for s in split]))
            return [sums]

        pair = steps.StepPair(add_n_per_core)
        return pair.timed, lambda: pair.verify(
            lambda results, _: steps.mismatch(
                np.concatenate([np.asarray(t) for t in results[0]]),
                expected,
            )
        )
    arrays = [np.asarray(v.value()) for v in replicas.variables]
    summer = roofline.NumpySum(arrays, 1 if name == ROOFLINE_NUMPY else cores)
    closers.append(summer.close)

    def check() -> str | None:
        summer()
        return steps.mismatch(summer.out, expected)

    return summer, check


# ---- One group in a process of its own --------------------------------------

_MODULE = "benchmarks.single_process"


def run_in_child(
    workload: workloads_lib.Workload,
    num_devices: int,
    candidates: Sequence[candidates_lib.Candidate],
    config: Config,
    advance: Callable[[int], object] = lambda n: None,
    describe: Callable[[str], object] = lambda s: None,
    timeout_seconds: float = 900.0,
) -> dict[str, Any]:
    """`run` in a fresh process with `num_devices` logical CPU devices.

    The process's memory high-water mark (allocators keep what they once
    had) and any crash stay with that group. Arguments as for `run`.

    Args:
        timeout_seconds: the longest the child may stay silent (it reports
            progress after every entry and measurement).

    Returns:
        The group's record, with `peak_rss_bytes` of the child.

    Raises:
        processes.ChildError: the child died, failed or went silent.

    >>> r1d = candidates_lib.Candidate(
    ...     "TF ReductionToOneDevice", "tf", "tf_r1d")
    >>> group = run_in_child(workloads_lib.single_tensor(64), 3, [r1d],
    ...                      Config(rounds=1, target_seconds=0.001))
    >>> group["num_replicas"], group["results"][-1]["verified"]
    (3, True)
    """
    child = processes.Child(
        f"{workload.name} x{num_devices}",
        processes.module_argv(_MODULE),
        processes.child_env({}),
    )
    try:
        child.send(
            {
                "workload": {
                    "name": workload.name,
                    "shapes": [list(s) for s in workload.shapes],
                    "description": workload.description,
                },
                "num_devices": num_devices,
                "candidates": [c.as_dict() for c in candidates],
                "config": dataclasses.asdict(config),
            }
        )
        while True:
            message = child.receive(timeout_seconds)
            if "advance" in message:
                advance(message["advance"])
            elif "describe" in message:
                describe(message["describe"])
            elif "record" in message:
                return message["record"]
            else:
                raise processes.ChildError(
                    f"{child.name}: {message.get('error', message)}"
                )
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
    _, job = processes.start(argv, run_in_child.__doc__)
    if job is None:
        return 0
    try:
        testing.request_cpu_devices(job["num_devices"])
        spec = job["workload"]
        workload = workloads_lib.Workload(
            spec["name"],
            tuple(tuple(s) for s in spec["shapes"]),
            spec["description"],
        )
        record = run(
            workload,
            job["num_devices"],
            [candidates_lib.Candidate.from_dict(c) for c in job["candidates"]],
            Config(**job["config"]),
            advance=lambda n: processes.reply({"advance": n}),
            describe=lambda text: processes.reply({"describe": text}),
        )
    except Exception as e:  # noqa: BLE001 - sent to the parent.
        processes.reply(
            {"error": f"{type(e).__name__}: {timing.first_line(str(e))}"}
        )
        return 1
    record["peak_rss_bytes"] = _peak_rss_bytes()
    processes.reply({"record": record})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
