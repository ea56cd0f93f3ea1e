"""What the machine can do: plain sums and loopback transfers.

Single process: an n-way sum of S bytes must read n*S bytes and write S. The
benchmark times that sum several ways on the same buffers, in the same
rounds as the candidates (`tf.add_n` on one device, `tf.add_n` over one
piece per core, numpy in one thread and in one thread per core) and takes
the fastest as the roofline.

Across processes: a ring all-reduce moves 2(p-1)/p * S bytes through each
worker's links. The roofline time is that many bytes at the fastest
loopback rate measured in the same run (`TcpLoopback` between two plain
processes, and TensorFlow's gRPC copy between two workers).

Across emulated hosts the wire, not the cores, bounds an all-reduce: the
roofline is those bytes at the links' shaped rate (`wire_seconds`), and
`bytes_sent_model` says what each host should send for an entry.

>>> aligned_pieces(100, 3, 16)
[48, 48, 4]
>>> summer = NumpySum([np.ones(40, np.float32)] * 3, threads=2)
>>> summer(); float(summer.out.sum())
120.0
"""

from __future__ import annotations

import concurrent.futures
import math
import re
import socket
import sys
from collections.abc import Sequence

import numpy as np

from tf_crossdevice import compression
from tf_crossdevice.cluster import hosts as hosts_lib
from tf_crossdevice.cluster import processes as _processes

# The receiver: reads `size` bytes per round and answers each round with one
# byte. Plain Python, so it starts at once; it takes its setup as the
# process layer's first command and exits when the connection closes, which
# the kernel also does when the benchmark dies.
_TCP_SINK = """
import json, socket, sys
setup = json.loads(sys.stdin.readline())
with socket.create_connection(("127.0.0.1", setup["port"])) as s:
    view = memoryview(bytearray(1 << 20))
    while True:
        left = setup["size"]
        while left:
            got = s.recv_into(view[: min(left, len(view))])
            if not got:
                sys.exit(0)
            left -= got
        s.sendall(b"k")
"""


def aligned_pieces(total: int, pieces: int, align: int) -> list[int]:
    """Splits `total` elements into at most `pieces` aligned pieces.

    Every piece but the last is a multiple of `align`; empty pieces are
    dropped.
    """
    if total <= 0:
        return [total]
    size = -(-total // (pieces * align)) * align
    return [min(size, total - start) for start in range(0, total, size)]


class NumpySum:
    """Sums equal-shaped arrays into a preallocated buffer, like add_n.

    Each call computes `out = arrays[0] + arrays[1] + ...` with `np.add`
    (`out=`), in `threads` chunks run by a thread pool (numpy releases the
    GIL in ufuncs).
    """

    def __init__(self, arrays: Sequence[np.ndarray], threads: int = 1):
        if len(arrays) < 2:
            raise ValueError(
                f"arrays: expected at least 2 arrays to sum, got {len(arrays)}"
            )
        self.arrays = list(arrays)
        self.out = np.empty_like(self.arrays[0])
        bounds = np.cumsum([0] + aligned_pieces(self.out.size, threads, 16))
        self._chunks = list(zip(bounds[:-1], bounds[1:], strict=True))
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(len(self._chunks))
            if len(self._chunks) > 1
            else None
        )

    def _sum_chunk(self, chunk: tuple[int, int]) -> None:
        lo, hi = chunk
        out = self.out[lo:hi]
        np.add(self.arrays[0][lo:hi], self.arrays[1][lo:hi], out=out)
        for array in self.arrays[2:]:
            np.add(out, array[lo:hi], out=out)

    def __call__(self) -> None:
        if self._pool is None:
            self._sum_chunk(self._chunks[0])
        else:
            list(self._pool.map(self._sum_chunk, self._chunks))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class TcpLoopback:
    """Times sending `num_bytes` over loopback TCP to another process.

    The receiver is a plain Python process that answers each `num_bytes`
    with one byte; each call sends and waits.
    """

    def __init__(self, num_bytes: int):
        self._payload = memoryview(bytes(max(num_bytes, 1)))[:num_bytes]
        with socket.create_server(("127.0.0.1", 0)) as server:
            server.settimeout(60)
            argv = [sys.executable, "-c", _TCP_SINK]
            self._sink = _processes.Child(argv, name="TCP sink")
            try:
                port = server.getsockname()[1]
                self._sink.send({"port": port, "size": num_bytes})
                self._socket, _ = server.accept()
            except BaseException:
                self._sink.stop()
                raise
        self._socket.settimeout(60)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __call__(self) -> None:
        self._socket.sendall(self._payload)
        if self._socket.recv(1) != b"k":
            raise RuntimeError("the loopback receiver went away")

    def close(self) -> None:
        self._socket.close()
        self._sink.stop()


def ring_bytes_per_worker(num_bytes: float, num_workers: int) -> float:
    """Bytes a ring all-reduce sends (and receives) per worker: 2(p-1)/p*S.

    >>> ring_bytes_per_worker(100, 2), ring_bytes_per_worker(90, 3)
    (100.0, 120.0)
    """
    return 2 * (num_workers - 1) / num_workers * num_bytes


def wire_seconds(num_bytes: int, num_hosts: int, link_rate: str) -> float:
    """The wire roofline: a bandwidth-optimal all-reduce's bytes per host,
    2(p-1)/p*S (Patarasuk-Yuan), at `link_rate` ('1gbit', as `tc` reads it).

    >>> wire_seconds(125_000_000, 2, "1gbit"), wire_seconds(3_000, 3, "8kbit")
    (1.0, 4.0)
    """
    rate = hosts_lib.parse_rate(link_rate) / 8  # bytes per second
    return ring_bytes_per_worker(num_bytes, num_hosts) / rate


# Entry names (prefixes) whose bytes per host follow a ring's, 2(p-1)/p*S:
# TF's collective (RING on CPU), ours between-graph (one replica per worker,
# or reduced inside each worker first), and our in-graph ring.
_RING_LIKE = (
    "TF MWMS",
    "ours HierarchicalCollectiveAllReduce",
    "ours MultiWorkerAllReduce xring",
)
# Everything to worker 0 and the sum back: worker 0 receives and sends
# (p-1)*S, every other worker S.
_TO_WORKER_0 = (
    "TF ReductionToOneDevice (in-graph)",
    "bound: sum on worker 0 and copy back, per tensor",
)
_COPY_0_TO_1 = (
    "roofline: TF gRPC copy worker 0 -> 1",
    "bound: TF gRPC copy worker 0 -> 1",
)
_SHUFFLE = re.compile(
    r"ours MultiWorkerAllReduce "
    r"(?:pscpu|\('pscpu(?:/pscpu)?', (\d+), -1\))(?: |$)"
)
_HALF = ("compression=bf16", "compression=fp16", "in bfloat16")
_COLLECTIVES = (
    "ours CollectiveAllReduce",
    "ours HierarchicalCollectiveAllReduce",
)


# Our entries with PowerSGD ("... compression=powersgd rank=4"): they send
# `powersgd_bytes` of the workload through the same all-reduce.
POWERSGD_NAME = re.compile(r" compression=powersgd rank=(\d+)")
# PowerSGD's default `min_compression_size` and `min_compression_rate`,
# which the candidates keep.
POWERSGD_MIN_SIZE = 4096
POWERSGD_MIN_RATE = 2.0


def powersgd_bytes(
    shapes: Sequence[Sequence[int]],
    rank: int,
    min_size: int = POWERSGD_MIN_SIZE,
    min_rate: float = POWERSGD_MIN_RATE,
) -> int:
    """The float32 bytes one replica puts into the all-reduces of a PowerSGD
    step of tensors of `shapes`: a tensor of two or more dimensions and at
    least `min_size` elements is an n x m matrix (m its last dimension) and
    sends P (n x r) and Q (m x r), r = min(n, m, rank), where those are at
    least `min_rate` times fewer than n*m values (PyTorch's rule); every
    other tensor is sent whole.

    This restates `PowerSGD.compresses` from the paper on purpose, so that
    the bytes model does not trust the code it scores; the benchmark's
    tests check both on ResNet-50's shapes.

    >>> powersgd_bytes([(3, 3, 64, 128), (128,), (10, 10)], rank=4)
    12176
    """
    values = 0
    for shape in shapes:
        size = math.prod(shape)
        if len(shape) >= 2 and size >= min_size:
            m = shape[-1]
            n = size // m
            r = min(n, m, rank)
            if (n + m) * r * min_rate < size:
                size = (n + m) * r
        values += size
    return 4 * values


def bytes_sent_model(
    name: str, num_bytes: int, num_hosts: int, local_devices: int = 1
) -> list[float] | None:
    """What each of `num_hosts` hosts sends for entry `name` (one replica
    holds `num_bytes`, each worker `local_devices` replicas), or None where
    the benchmark has no model of it. 16-bit wire formats send half.

    - TF's and our collectives, the hierarchical one and the in-graph ring:
      2(p-1)/p*S per host. Our flat collective with k > 1 local devices is
      one ring over p*k replicas, a worker's k in a row: each host sends
      what one replica of that ring sends, 2(pk-1)/(pk)*S.
    - our collectives with 16-bit compression: an all-gather of p
      half-size messages, (p-1)*S/2, where that is fewer bytes than the
      ring (p <= 3); else the uncompressed ring.
    - the shuffle (pscpu, `shards` shards, shard j summed on worker j mod
      p, each a `shards`-th of S): host i sends its shards to their owners
      and the sums of the shards it owns to every other host,
      (1 - f_i)*S + (p-1)*f_i*S with f_i its share of the shards.
    - PowerSGD: what its all-reduce sends for the bytes PowerSGD puts in
      (`powersgd_bytes`, which the caller passes as `num_bytes`).
    - TF's in-graph ReductionToOneDevice and the sum-on-worker-0 bound:
      (p-1)*S from worker 0, S from each other; the gRPC copy: S from
      worker 0 only.

    >>> bytes_sent_model("TF MWMS RING", 90, 3)
    [120.0, 120.0, 120.0]
    >>> bytes_sent_model("ours MultiWorkerAllReduce pscpu num_packs=1", 90, 3)
    [180.0, 90.0, 90.0]
    >>> bytes_sent_model("ours MultiWorkerAllReduce ('pscpu', 3, -1)", 90, 3)
    [120.0, 120.0, 120.0]
    >>> bytes_sent_model(
    ...     "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) "
    ...     "compression=bf16", 100, 2)
    [50.0, 50.0]
    >>> bytes_sent_model("ours CollectiveAllReduce", 100, 2, 2)
    [150.0, 150.0]
    >>> bytes_sent_model("ours CollectiveAllReduce compression=bf16", 100, 3)
    [100.0, 100.0, 100.0]
    >>> bytes_sent_model("ours CollectiveAllReduce compression=bf16", 100, 4)
    [150.0, 150.0, 150.0, 150.0]
    >>> bytes_sent_model("ours MultiWorkerAllReduce rechd", 100, 2) is None
    True
    """
    p, s = num_hosts, float(num_bytes)
    compressed = any(word in name for word in _HALF)
    if compressed and name.startswith(_COLLECTIVES):
        # Between workers, a group of p members all-gathers 16-bit messages
        # where that moves fewer bytes than the ring, (p-1)*S/2 for p <= 3;
        # larger groups reduce uncompressed (see
        # tf_crossdevice.compression.gather_compression_pays).
        flat = name.startswith("ours CollectiveAllReduce")
        if flat and local_devices > 1:
            return None  # The gather spans workers' local devices too.
        if compression.gather_compression_pays(p):
            return [(p - 1) * s / 2] * p
        return [ring_bytes_per_worker(s, p)] * p
    if compressed:
        s /= 2
    if name.startswith(_RING_LIKE):
        return [ring_bytes_per_worker(s, p)] * p
    if name.startswith("ours CollectiveAllReduce"):
        replicas = p * local_devices
        return [ring_bytes_per_worker(s, replicas)] * p
    if name.startswith(_TO_WORKER_0):
        return [(p - 1) * s] + [s] * (p - 1)
    if name.startswith(_COPY_0_TO_1):
        return [s] + [0.0] * (p - 1)
    match = _SHUFFLE.match(name)
    if match and local_devices == 1:
        shards = int(match[1] or 1)
        owned = [sum(j % p == i for j in range(shards)) for i in range(p)]
        shares = [n / shards for n in owned]
        return [(1 - f) * s + (p - 1) * f * s for f in shares]
    return None
