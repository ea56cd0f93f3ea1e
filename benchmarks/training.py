"""The example job on emulated hosts, against TensorFlow's strategy.

What a user finally sees is the examples/s of a training job, not the time
of one all-reduce. With `--training_hosts=2,4`, the benchmark runs
examples/train.py on that many emulated hosts (links shaped to
`--link_rate`, an equal share of the cores each), one job after another in
this run:

- TensorFlow's `MultiWorkerMirroredStrategy` (the job's baseline mode),
  RING with 2 MiB and with 4 MiB packs (its fastest sizes between hosts;
  its default, one pack, is slower), so that ours meets it at its best;
- our `CollectiveAllReduce` under our `MultiWorkerMirroredStrategy` with
  its defaults and the same custom loop, and our
  `HierarchicalCollectiveAllReduce` with 2 logical devices per host, with
  its defaults;
- our in-graph `MultiWorkerAllReduce`, with the spec `pscpu#p` (p hosts:
  one shard of each pack summed on each host), run by one controller that
  reaches the hosts over their bridge and whose CPU time is charged to the
  first host (its process joins that host's CPU cgroup), so that the job
  gets no CPU beyond the hosts' shares;
- our flat collective and in-graph jobs again with bfloat16 on the wire
  (not on one host, where nothing crosses a link).

Each trains the same model (a dense network whose gradients take about as
long to all-reduce across hosts as a step takes to compute them) on the
same examples, 256 per host per step, and times its step's parts after
training (--timing_steps: the same step on one host alone, the all-reduce
alone, and the cores the first host kept busy during each). Each job's
figures come from its chief's summary.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import sys
from collections.abc import Sequence

from benchmarks.records import Job
from tf_crossdevice.cluster import processes

TRAIN = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train.py"
# A 3.9M-parameter dense network: its float32 gradients (15.6 MB) need
# 187 ms of a 1 Gbit/s link to all-reduce between 4 hosts (2(p-1)/p of
# them each way), of the order of a step's compute on 256 examples with
# half a core.
MODEL_FLAGS = (
    "--model=dense",
    "--width=1024",
    "--depth=4",
    "--steps=60",
    "--log_every=20",
    "--timing_steps=10",
)
PER_HOST_BATCH = 256
TF_2MIB = "TF MWMS bytes_per_pack=2MiB"
TF_4MIB = "TF MWMS bytes_per_pack=4MiB"
COLLECTIVE = "ours CollectiveAllReduce"
HIERARCHICAL = "ours HierarchicalCollectiveAllReduce, 2 devices per host"
IN_GRAPH = "ours in-graph MultiWorkerAllReduce pscpu, a shard per host"
BF16 = " compression=bf16"
JOBS = (
    TF_2MIB,
    TF_4MIB,
    COLLECTIVE,
    COLLECTIVE + BF16,
    HIERARCHICAL,
    IN_GRAPH,
    IN_GRAPH + BF16,
)
# Our defaults, each held to the overlap and core-bound targets.
DEFAULT_MODES = (COLLECTIVE, HIERARCHICAL, IN_GRAPH)
_STRATEGY_FLAGS = {
    TF_2MIB: [
        "--cross_device_ops=TensorFlow",
        "--devices_per_worker=1",
        f"--bytes_per_pack={2 << 20}",
    ],
    TF_4MIB: [
        "--cross_device_ops=TensorFlow",
        "--devices_per_worker=1",
        f"--bytes_per_pack={4 << 20}",
    ],
    COLLECTIVE: [
        "--cross_device_ops=CollectiveAllReduce",
        "--devices_per_worker=1",
    ],
    HIERARCHICAL: [
        "--cross_device_ops=HierarchicalCollectiveAllReduce",
        "--devices_per_worker=2",
    ],
}


def jobs_for(hosts: int) -> tuple[str, ...]:
    """The jobs run on `hosts` hosts: on one, nothing crosses a link and
    the compressed jobs are left out."""
    return JOBS if hosts > 1 else tuple(j for j in JOBS if BF16 not in j)


def command(
    name: str,
    hosts: int,
    link_rate: str,
    model_flags: Sequence[str] = MODEL_FLAGS,
) -> list[str]:
    """The command line that runs job `name` on `hosts` emulated hosts."""
    train = [
        sys.executable,
        str(TRAIN),
        *model_flags,
        f"--batch_size={PER_HOST_BATCH * hosts}",
    ]
    if name not in JOBS:
        raise ValueError(
            f"name: expected one of {', '.join(JOBS)}, got {name!r}"
        )
    base = name.removesuffix(BF16)
    if base != name:
        train.append("--compression=bf16")
    if base == IN_GRAPH:
        # The bandwidth-optimal parameter-server split: each host sums one
        # shard of every pack and sends it back.
        return [
            *train,
            "--mode=in_graph",
            "--devices_per_worker=1",
            f"--all_reduce_spec=pscpu#{hosts}",
            f"--num_workers={hosts}",
            f"--link_rate={link_rate}",
        ]
    return [
        sys.executable,
        "-m",
        "tf_crossdevice.launch",
        f"--num_workers={hosts}",
        "--emulate_hosts",
        f"--link_rate={link_rate}",
        "--",
        *train,
        "--job_name=worker",
        "--loop=custom",
        *_STRATEGY_FLAGS[base],
    ]


def parse(
    name: str, hosts: int, link_rate: str, argv: list[str], out: str
) -> Job:
    """Job `name`'s figures from its chief's summary `out` (lines may carry
    the launcher's "[worker 0] " prefix); a figure not found is None."""

    def number(pattern: str) -> float | None:
        found = re.search(pattern, out)
        return float(found[1]) if found else None

    parts = re.search(
        r"step ([\d.]+) ms; this host alone ([\d.]+) ms; all-reduce alone "
        r"([\d.]+) ms",
        out,
    )
    step, alone, all_reduce = (
        (float(t) / 1e3 for t in parts.groups()) if parts else (None,) * 3
    )
    cores = re.search(
        r"cores busy \(CPU time / wall time\): step ([\d.]+), alone "
        r"([\d.]+), all-reduce alone ([\d.]+)",
        out,
    )
    return Job(
        name,
        hosts,
        link_rate,
        shlex.join(argv),
        number(r"total examples/s: ([\d.]+)"),
        number(r"held-out accuracy: ([\d.]+)"),
        step,
        alone,
        all_reduce,
        cores=[float(c) for c in cores.groups()] if cores else None,
        forward_seconds=_seconds(number(r"forward pass alone ([\d.]+) ms")),
    )


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def run_job(
    name: str,
    hosts: int,
    link_rate: str,
    timeout_seconds: float,
    model_flags: Sequence[str] = MODEL_FLAGS,
) -> Job:
    """Runs job `name` to its end and reads its summary. A job that fails
    or runs past `timeout_seconds` (then stopped: SIGTERM, which tears its
    hosts down, then SIGKILL) comes back with `error` set."""
    argv = command(name, hosts, link_rate, model_flags)
    with processes.Child(argv, name=name, cwd=str(TRAIN.parents[1])) as child:
        try:
            out, error = "\n".join(child.read_all(timeout_seconds)), ""
        except processes.ChildError as e:
            # Its first line and the last line of its stderr.
            lines = str(e).strip().splitlines()
            out, error = "", " ".join(dict.fromkeys([lines[0], lines[-1]]))
    job = parse(name, hosts, link_rate, argv, out)
    if not error and (job.examples_per_second is None or not job.step_seconds):
        error = "its summary has no examples/s or step parts"
    job.error = error
    return job
