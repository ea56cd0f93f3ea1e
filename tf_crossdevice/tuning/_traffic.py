"""What one all-reduce of one pack costs the busiest worker, as counts.

Pure Python over byte and device counts; no TensorFlow.
`tf_crossdevice.cost_model` turns the counts into seconds with fitted
constants (alpha per message, beta per byte on each link kind, gamma per
byte reduced, delta per graph op).

Conventions, shared by every function here:

- `size` is the pack's size in bytes on one device; `n` devices take part,
  `k` of them on each worker (`n // k` workers, devices numbered
  worker-major: worker w holds devices `w*k .. w*k + k - 1`).
- A message between devices of one worker crosses the "memory" link (two
  logical devices of one process); between workers, the "network" link.
- Counts are for ONE worker, the busiest (worker 0, which holds the roots
  and gather devices of the schedules that have them). Its devices share
  one thread pool (a CPU process), so their messages, bytes, sums and ops
  are ADDED: the worker is one-port and serial, in Thakur, Rabenseifner and
  Gropp's sense. Workers run in parallel, so a step takes the busiest
  worker's time.
- Messages and bytes count what the worker SENDS; in every schedule here a
  worker receives as much as it sends (links are full duplex). So
  `net_bytes` is what the busiest worker's network link carries in each
  direction: on links of known rate (hosts whose wire is the bottleneck)
  `(net_bytes + one_way_bytes) / rate` is the step's wire time (below).
  It is neither a total over
  workers nor an average: for the shuffle it is the shard owners' bytes,
  for a reduction to one device the root's.
- `incast_bytes` counts what the busiest worker receives while several
  workers send to it at once, beyond one sender's share: a root that
  gathers `b` bytes from `s` senders at once counts `(s-1)/s b`. Senders
  converging on one link share its queue and lose throughput to each
  other (TCP incast); rings and halving-doubling, one sender at a time,
  count none.
- `serial_bytes` is the size of the step's largest pack (`cost_model`
  keeps the largest of its packs', as for `one_way_bytes`): a pack's own
  transfer cannot hide its reduction and copies, other packs' transfers
  can, so the largest pack's processing stays on the critical path. A
  pack that a group of n all-gathers compressed counts n times its size:
  every member decodes the n messages to full precision and sums them
  after the gather.
- `one_way_bytes` is what the busiest worker's link carries of one pack
  in one direction while the other direction has nothing of that pack
  to carry. A root or shard owner receives in the gather and sends in
  the broadcast: in each of the two phases its link carries `max(a, b)`
  (`a` the bytes of the shards it owns coming in, `b` those of the
  others' going out), `2 max(a, b) = a + b + |a - b|` in all, `|a - b|`
  beyond `net_bytes`. Halving-doubling's fold-in partners receive an
  extra device's shard, then send the result back: that shard, where
  the extra is on another worker. Other packs' transfers can fill the
  idle direction, so a step keeps the largest count of any one pack, not
  their sum (`cost_model` keeps it; `+` and `scaled` add and scale it
  like every count, for one pack's parts). Rings and all-gathers send
  and receive at once and count none; the hierarchical copy, whose root
  rotates over the workers pack by pack, counts none either (its counts
  are the mean over packs).
- `reduce_bytes` counts bytes summed: adding two `b`-byte tensors reduces
  `b` bytes, an `add_n` of `m` of them `(m - 1) b`.
- `ops` counts graph ops the worker runs besides the transfers (a transfer
  is a Send/Recv pair that the per-message alpha prices).

>>> from tf_crossdevice.tuning import _traffic as traffic
>>> t = traffic.ring(size=800, n=4, k=1, shards=1)
>>> t.net_messages, t.net_bytes, t.reduce_bytes   # 2(p-1), 2(p-1)/p n ...
(6.0, 1200.0, 600.0)
"""

from __future__ import annotations

import dataclasses
import functools
import math

# Ops per device per pack around a builder: flatten, pad and split before,
# concatenate, slice and reshape after (tf_crossdevice.algorithms._flat).
# The pad and the concatenation copy the pack; TensorFlow's CPU Split along
# axis 0 aliases its input when the pieces are aligned, so it is free.
FLAT_OPS = 6
FLAT_COPIES = 2


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Counts for one worker (see the module docstring)."""

    net_messages: float = 0.0
    net_bytes: float = 0.0
    mem_messages: float = 0.0
    mem_bytes: float = 0.0
    copy_bytes: float = 0.0  # memcpy inside a device: packing, concat
    reduce_bytes: float = 0.0
    ops: float = 0.0
    collectives: float = 0.0  # collective all-reduce ops launched
    incast_bytes: float = 0.0  # received from several senders at once
    serial_bytes: float = 0.0  # the largest pack (see the module docstring)
    one_way_bytes: float = 0.0  # one pack's, one direction at a time

    def __add__(self, other: Traffic) -> Traffic:
        """Every count summed: the parts of one pack, or packs whose
        one-way bytes the caller then sets (see the module docstring)."""
        return Traffic(
            *(
                a + b
                for a, b in zip(self._counts(), other._counts(), strict=True)
            )
        )

    def scaled(self, factor: float) -> Traffic:
        """Every count times `factor` (e.g. the number of equal packs)."""
        return Traffic(*(a * factor for a in self._counts()))

    def _counts(self) -> tuple[float, ...]:
        # Not `dataclasses.astuple`, which deep-copies each field: a
        # prediction adds thousands of these.
        return tuple(getattr(self, name) for name in _COUNTS)

    def send(self, messages: float, num_bytes: float, network: bool) -> Traffic:
        """These counts plus `messages` sends totalling `num_bytes`."""
        if network:
            return dataclasses.replace(
                self,
                net_messages=self.net_messages + messages,
                net_bytes=self.net_bytes + num_bytes,
            )
        return dataclasses.replace(
            self,
            mem_messages=self.mem_messages + messages,
            mem_bytes=self.mem_bytes + num_bytes,
        )

    def compressed(
        self, wire_ratio: float, cast_ops: int, passes: int = 2
    ) -> Traffic:
        """Every message cast to a 16-bit wire format and back.

        Wire bytes shrink by `wire_ratio` (2 / itemsize); each message costs
        `cast_ops` more ops (encode on the sender, decode on the receiver)
        and `passes` elementwise passes over its full-precision bytes,
        priced like a sum (a cast each way: 2).
        """
        messages = self.net_messages + self.mem_messages
        sent = self.net_bytes + self.mem_bytes
        return dataclasses.replace(
            self,
            net_bytes=self.net_bytes * wire_ratio,
            incast_bytes=self.incast_bytes * wire_ratio,
            one_way_bytes=self.one_way_bytes * wire_ratio,
            mem_bytes=self.mem_bytes * wire_ratio,
            reduce_bytes=self.reduce_bytes + passes * sent,
            ops=self.ops + cast_ops * messages,
        )


_COUNTS = tuple(f.name for f in dataclasses.fields(Traffic))
NONE = Traffic()


def incast(num_bytes: float, senders: int) -> float:
    """The incast share of `num_bytes` received from `senders` workers at
    once: all of it but one sender's share.

    >>> incast(300.0, 3), incast(300.0, 1)
    (200.0, 0.0)
    """
    return num_bytes * (senders - 1) / senders if senders > 1 else 0.0


def _check(n: int, k: int) -> int:
    if k < 1 or n < 1 or n % k:
        raise ValueError(
            f"n={n}, k={k}: expected n devices in n // k workers of k each"
        )
    return n // k


@functools.lru_cache(maxsize=65536)
def ring(
    size: float,
    n: int,
    k: int,
    shards: int = 1,
    step_ops: int = 1,
    fixed_ops: int = FLAT_OPS,
    copies: int = FLAT_COPIES,
) -> Traffic:
    """Ring all-reduce ("xring"; a collective or NCCL kernel with
    `step_ops=0, fixed_ops=1, copies=0`).

    Per shard each device sends `2 (n - 1)` chunks of `size / (shards n)`:
    Thakur's `2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma`. The ring
    visits devices in order, so each worker has one network hop and `k - 1`
    memory hops per ring direction.
    """
    workers = _check(n, k)
    if n == 1:
        return Traffic(ops=1)
    messages = 2 * (n - 1) * shards
    chunk = size / (shards * n)
    per_device = Traffic(
        copy_bytes=copies * size,
        reduce_bytes=(n - 1) * shards * chunk,
        ops=fixed_ops + step_ops * messages,
    )
    t = per_device.scaled(k)
    if workers == 1:
        return t.send(k * messages, k * messages * chunk, network=False)
    t = t.send(messages, messages * chunk, network=True)
    return t.send((k - 1) * messages, (k - 1) * messages * chunk, False)


@functools.lru_cache(maxsize=65536)
def compressed_gather(
    size: float, n: int, k: int, wire_ratio: float, scaled: bool = False
) -> Traffic:
    """A collective group's compressed all-reduce of one pack.

    Each of the `n` members encodes its `size` bytes to `wire_ratio * size`,
    one all-gather (TensorFlow's ring: `n - 1` messages per member) brings
    every member's message to every member, and each member decodes the
    `n` messages and sums them: per member `(n-1) * wire_ratio * size`
    bytes sent, `(n-1) * size` bytes summed and `(n+1) * size` bytes cast
    (encode once, decode n times; priced like sums). A `scaled` codec
    (fp16, and bf16 of float64) encodes in 4 passes (largest and smallest
    value, multiply, cast) and decodes in 2 (cast, multiply).

    >>> t = compressed_gather(size=800, n=2, k=1, wire_ratio=0.5)
    >>> t.net_messages, t.net_bytes, t.reduce_bytes
    (1.0, 400.0, 3200.0)
    """
    workers = _check(n, k)
    sent = (n - 1) * wire_ratio * size
    encode, decode = (4, 2) if scaled else (1, 1)
    passes = (n - 1) + encode + decode * n
    per_member = Traffic(reduce_bytes=float(passes * size), ops=n + 2)
    t = per_member.scaled(k)
    if workers == 1:
        return t.send(k * (n - 1), k * sent, network=False)
    t = t.send(n - 1, sent, network=True)
    return t.send((k - 1) * (n - 1), (k - 1) * sent, network=False)


@functools.lru_cache(maxsize=65536)
def halving_doubling(size: float, n: int, k: int, shards: int = 1) -> Traffic:
    """Recursive halving-doubling ("rechd") for any `n`.

    With `p = 2**floor(log2 n)`: `2 log2(p)` messages per shard, the
    halving ones `size / shards / 2**(j+1)` bytes at distance `2**j`, the
    same bytes again doubling back: Thakur's `2 log2(p) alpha + 2(p-1)/p n
    beta + (p-1)/p n gamma`. When n is not a power of two the `r = n - p`
    extra devices first send their whole shard to partners `0 .. r-1` and
    get the result back, so a partner pays `(2 log2 p + 1)` messages,
    `(2(p-1)/p + 1) n` bytes and `((p-1)/p + 1) n` bytes reduced, its
    link one way for the shard in and the result out where the extra is
    on another worker (`one_way_bytes`: `n`). Pairs
    `v XOR 2**j` on the same worker use the memory link. Worker 0 holds
    the first partners, so it is the busiest (rotation of the virtual ranks
    per shard is ignored).
    """
    _check(n, k)
    if n == 1:
        return Traffic(ops=1)
    p = 1 << (n.bit_length() - 1)
    r = n - p
    steps = p.bit_length() - 1
    shard = size / shards
    t = NONE
    for d in range(k):
        if d < p:
            held = shard
            for j in range(steps):
                held /= 2
                partner = d ^ (1 << j)
                # One message halving, one doubling back, `held` bytes each.
                t = t.send(2, 2 * held, network=partner >= k)
                t += Traffic(reduce_bytes=held)
            if d < r:  # fold-in partner: adds the extra's shard, sends back
                t = t.send(1, shard, network=p + d >= k)
                # The shard comes in before the exchanges and the result
                # goes back after them: one way each time.
                t += Traffic(
                    reduce_bytes=shard,
                    one_way_bytes=shard if p + d >= k else 0.0,
                )
            t += Traffic(ops=2 * steps + (2 if d < r else 0))
        else:  # an extra device: sends its shard, gets the result
            t = t.send(1, shard, network=d - p >= k)
            t += Traffic(ops=2)
    flat = Traffic(copy_bytes=FLAT_COPIES * size, ops=FLAT_OPS).scaled(k)
    return t.scaled(shards) + flat


@functools.lru_cache(maxsize=65536)
def shuffle(
    size: float, n: int, k: int, shards: int = 1, per_worker: bool = True
) -> Traffic:
    """Shuffle all-reduce: gather each shard on its owner, sum, broadcast.

    `per_worker` ("pscpu"): the owners are the workers' first devices,
    shard j on worker `j % workers`; else ("psgpu") every device owns
    shards, shard j on device `j % n`. Each device sends every shard it
    does not own to its owner; an owner sums `n` copies (`(n-1)` shard
    bytes reduced) and sends the sum to the `n - 1` other devices. With one
    shard: `2 (p-1)` messages of n bytes on the owner, the root of a
    gather then a broadcast.
    """
    workers = _check(n, k)
    if n == 1:
        return Traffic(ops=1)
    shards = min(shards, max(1, int(size)))
    piece = size / shards
    # Reshape, (split), ..., (concatenate: a copy), reshape on each device.
    split = shards > 1
    t = Traffic(
        copy_bytes=k * (size if split else 0),
        ops=k * (2 + (2 if split else 0)),
    )
    # Bytes worker 0 receives in the gather and sends in the broadcast
    # (its shards), and those it sends in the gather and receives back.
    owned = others = 0.0
    for j in range(shards):
        owner_device = (j % workers) * k if per_worker else j % n
        owner_worker = owner_device // k
        if owner_worker == 0:
            # k - 1 local devices send to the owner; the owner sums and
            # sends the sum to everyone else.
            t = t.send(k - 1, (k - 1) * piece, network=False)
            t = t.send(k - 1, (k - 1) * piece, network=False)
            t = t.send(n - k, (n - k) * piece, network=True)
            # The other workers' pieces arrive at once.
            gathered = incast((n - k) * piece, workers - 1)
            t += Traffic(
                reduce_bytes=(n - 1) * piece, ops=1, incast_bytes=gathered
            )
            owned += (n - k) * piece
        else:
            t = t.send(k, k * piece, network=True)
            others += k * piece
    return dataclasses.replace(t, one_way_bytes=abs(owned - others))


@functools.lru_cache(maxsize=65536)
def one_device(size: float, n: int, k: int) -> Traffic:
    """Reduction to one device (device 0): `n - 1` messages in, an
    `add_n`, `n - 1` messages out; all on worker 0, whose link receives
    the gather and then sends the broadcast (one way at a time)."""
    workers = _check(n, k)
    # Every other worker sends its tensors to the root at once.
    gathered = incast((n - k) * size, workers - 1)
    t = Traffic(
        reduce_bytes=(n - 1) * size,
        ops=1 + k,
        incast_bytes=gathered,
        one_way_bytes=(n - k) * size,
    )
    t = t.send(2 * (k - 1), 2 * (k - 1) * size, network=False)
    return t.send(n - k, (n - k) * size, network=True)


@functools.lru_cache(maxsize=65536)
def hierarchical_copy(size: float, n: int, k: int) -> Traffic:
    """Hierarchical copy: two group sums, the total, copies back.

    `2n - 2` messages of `size` and `(n-1) size` bytes reduced in all; the
    main device rotates with the tensor's index, so across a batch the load
    spreads evenly over the workers (each gets `1 / workers` of it). A
    message stays on a worker with probability `(k-1)/(n-1)`.
    """
    workers = _check(n, k)
    if n == 1:
        return Traffic(ops=1)
    messages = (2 * n - 2) / workers
    local = (k - 1) / (n - 1)
    t = Traffic(reduce_bytes=(n - 1) * size / workers, ops=(n + 4) / workers)
    t = t.send(messages * local, messages * local * size, network=False)
    return t.send(
        messages * (1 - local), messages * (1 - local) * size, network=True
    )


def two_level(
    inner: Traffic, outer: Traffic, size: float, n: int, k: int
) -> Traffic:
    """Inner all-reduce in each worker, outer across one device per
    worker, then the representative copies the sum to its `k - 1` peers.

    `inner` is the inner algorithm's counts for `(size, k, k)`, `outer`
    the outer's for `(size, n // k, 1)`; a one-device inner and a
    one-worker outer are skipped.
    """
    workers = _check(n, k)
    t = NONE
    if k > 1:
        t += inner
        if workers > 1:
            t = t.send(k - 1, (k - 1) * size, network=False)
            t += Traffic(ops=k - 1)
    if workers > 1:
        t += outer
    if n == 1:
        t = Traffic(ops=1)
    return t


def pack_traffic(
    member_bytes: list[float], num_packs: int, devices: int
) -> Traffic:
    """Concatenating `member_bytes` tensors into `num_packs` packs and
    back, on each of `devices` devices of a worker: a reshape per member,
    a concatenation (a copy) and a split (free: TensorFlow's CPU Split
    along axis 0 aliases); several packs add a split and a concatenation
    (a copy). One member is only reshaped.

    >>> pack_traffic([4.0, 8.0], num_packs=1, devices=2)
    Traffic(net_messages=0.0, net_bytes=0.0, mem_messages=0.0, mem_bytes=0.0, copy_bytes=24.0, reduce_bytes=0.0, ops=12, collectives=0.0, incast_bytes=0.0, serial_bytes=0.0, one_way_bytes=0.0)
    """  # noqa: E501
    m = len(member_bytes)
    size = math.fsum(member_bytes)
    if m == 1 and num_packs == 1:
        return Traffic(ops=2).scaled(devices)
    copies = 1 if num_packs == 1 else 2
    per_device = Traffic(copy_bytes=copies * size, ops=2 * m + 2 * copies)
    return per_device.scaled(devices)
