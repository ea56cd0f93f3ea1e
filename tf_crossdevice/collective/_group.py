"""One collective group and the ops its members launch, device by device.

A group is a set of devices, across worker processes, that meet in the same
collective ops: this process's `devices` plus the same number on every other
worker, `size` in all. TensorFlow matches the members of one collective by
(group key, instance key), so every worker must draw the same keys in the
same order: every process runs the same program, and keys come from a
counter (TensorFlow's CollectiveKeys) that every process advances alike.

Inside a tf.function the instance key is read when the function is called,
not when it is traced (TensorFlow's own launcher does the same), so every
call of a traced training step gets fresh keys. Every device holds an
ordering token, a resource its collectives all touch, so that they run in
program order: without it two devices of one process can start different
collectives first and wait for each other for good.

Options are `tf.distribute.experimental.CommunicationOptions`:
`timeout_seconds` becomes each op's timeout (TensorFlow then raises
DeadlineExceededError instead of hanging), `implementation` its
communication hint. NCCL runs on GPUs only: on other devices NCCL becomes
RING, logged once.

Wire compression (`compression="bf16"` or `"fp16"`, for float32 and
float64 values): TensorFlow's all-reduce sums in the dtype it is given, so
a 16-bit all-reduce would add in 16 bits. Instead every member encodes its
value (`tf_crossdevice.compression._codec`), one all-gather brings
every member's 16-bit message (and fp16's scale) to every member, and each
member decodes and sums the messages in the value's own dtype, in member
order (so every member gets the same bits). Per member that moves
(p-1)·S/2 bytes for S bytes of float32 where TensorFlow's ring moves
2(p-1)/p·S: fewer for groups of p <= 3 members, as many at 4, more beyond.
Larger groups run the uncompressed all-reduce (exact), logged once per
group (`compression.gather_compression_pays`). A group of one
worker's devices alone is never compressed: nothing crosses a worker
boundary.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, TypeAlias

import tensorflow as tf
from absl import logging

from tf_crossdevice import compression as codec
from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice._core import tf_internal
from tf_crossdevice.collective import _entering
from tf_crossdevice.compression import gather_compression_pays

# tf.distribute.experimental.CommunicationOptions (TensorFlow has no stubs).
Options: TypeAlias = Any
_NCCL = tf.distribute.experimental.CommunicationImplementation.NCCL


class Group:
    """A collective group: its key, size and this process's members.

    Args:
        keys: TensorFlow CollectiveKeys shared by everything that must not
            reuse a key.
        devices: this process's devices in the group (canonical names).
        size: devices in the group across every worker.
        name: names the group's ops (and so TensorFlow's errors about them).
    """

    def __init__(
        self, keys: Any, devices: Sequence[str], size: int, name: str
    ) -> None:
        self.devices = tuple(devices)
        self.size = size
        self.name = name
        self._keys = keys
        # The size is part of the key's identity: TensorFlow binds a group
        # key to one membership for the life of the cluster.
        self.key = keys.get_group_key([*self.devices, f"group_size:{size}"])
        self._tokens: dict[str, Any] = {}

    def _instance_key(self, device: str, call_time: bool = True) -> Any:
        graph = tf_internal.function_graph_being_built()
        if graph is None or not call_time:
            return self._keys.get_instance_key(self.key, device)
        with graph.as_default():
            return graph.capture_call_time_value(
                lambda: tf.constant(
                    self._keys.get_instance_key(self.key, device), tf.int32
                ),
                tf.TensorSpec([], tf.int32),
            )

    def _token(self, device: str) -> Any:
        if not tf.compat.v1.executing_eagerly_outside_functions():
            # A variable would need a Session to initialize it: TF 1 graphs
            # are ordered with control edges instead (`_launch`).
            return None
        if device not in self._tokens:
            with tf.init_scope(), tf.device(device):
                self._tokens[device] = tf_internal.new_resource_variable(0.0)
        return self._tokens[device].handle

    def _common(
        self,
        index: int,
        options: Options,
        ordered: bool = True,
        call_time_key: bool = True,
    ) -> dict[str, Any]:
        device = self.devices[index]
        common = {
            "group_size": self.size,
            "group_key": self.key,
            "instance_key": self._instance_key(device, call_time_key),
            "communication_hint": hint(options, device),
            "timeout": options.timeout_seconds or 0,
        }
        if ordered:
            common["ordering_token"] = self._token(device)
        return common

    def broadcast(
        self, index: int, value: tf.Tensor, send: bool, options: Options
    ) -> tf.Tensor:
        """The sending member's `value`, on every member.

        TensorFlow's broadcast ops take no ordering token; used for
        variables' initial values, before any other collective. Its
        instance key is fixed when the op is built, as in TensorFlow's
        strategy: tf.function lifts the initializer of a variable created
        while it traces out of the function and runs it once before it,
        where a value captured at call time would never be fed.
        """
        ops = tf_internal.collective_ops()
        common = self._common(
            index, options, ordered=False, call_time_key=False
        )
        with tf.device(self.devices[index]):
            if send:
                sent = ops.broadcast_send_v2(value, **common)
                with tf.control_dependencies([sent]):
                    return tf.identity(value)
            return ops.broadcast_recv_v2(tf.shape(value), value.dtype, **common)

    def all_reduce(
        self,
        index: int,
        tensor: tf.Tensor,
        options: Options,
        compression: str | None = None,
    ) -> tf.Tensor:
        """The sum of `tensor` over the group, on member `index`'s device.

        With `compression` set, a float32 or float64 `tensor` crosses in 16
        bits and is summed in its own dtype (`all_reduce_compressed`), when
        the group spans several workers and is small enough for that to
        move fewer bytes (`gather_compression_pays`); otherwise, and for
        other dtypes, it is all-reduced exactly.
        """
        if tensor.shape.num_elements() == 0:
            # The sum of empty tensors is empty. Every worker knows the
            # static shape, so all skip the collective alike and draw no
            # instance key (a 0-element collective crashed the process).
            with tf.device(self.devices[index]):
                return tf.identity(tensor)
        # A group of this process's devices alone crosses no worker
        # boundary: nothing to save, so nothing is rounded.
        if (
            compression is not None
            and codec.compresses(tensor.dtype, compression)
            and self.size > len(self.devices)
        ):
            if gather_compression_pays(self.size):
                return self.all_reduce_compressed(
                    index, tensor, compression, options
                )
            _log_uncompressed(self.name, self.size)
        with tf.device(self.devices[index]):
            wire = _on_the_wire(tensor)
            summed = _launch(
                self.devices[index],
                tf_internal.collective_ops().all_reduce_v2,
                wire,
                name=f"{self.name}_all_reduce",
                **self._common(index, options),
            )
            return summed if wire is tensor else tf.cast(summed, tensor.dtype)

    def all_reduce_compressed(
        self,
        index: int,
        tensor: tf.Tensor,
        compression: str,
        options: Options,
    ) -> tf.Tensor:
        """The sum of `tensor` over the group, its messages in 16 bits.

        One all-gather of every member's encoded `tensor` (its parts as
        16-bit words, so bfloat16 and fp16's scale travel in one
        collective), then the decoded messages summed in `tensor`'s dtype,
        member by member in group order: every member computes the same
        bits. Whatever the group's size (`all_reduce` picks by size).
        """
        with tf.device(self.devices[index]):
            parts = codec.encode(tensor, compression)
            words = [_as_half_words(p) for p in parts]
            message = words[0] if len(words) == 1 else tf.concat(words, 0)
            gathered = _launch(
                self.devices[index],
                tf_internal.collective_ops().all_gather_v2,
                message,
                name=f"{self.name}_compressed_all_gather",
                **self._common(index, options),
            )
            per_member = tf.reshape(gathered, [self.size, -1])
            sizes = [_static_or_dynamic_size(w) for w in words]
            messages = []
            for member in range(self.size):
                pieces = (
                    [per_member[member]]
                    if len(words) == 1
                    else tf.split(per_member[member], sizes)
                )
                decoded = [
                    _from_half_words(piece, part)
                    for piece, part in zip(pieces, parts, strict=True)
                ]
                messages.append(
                    codec.decode(decoded, tensor.dtype, compression)
                )
            total = messages[0]
            for message in messages[1:]:
                total = total + message
            return tf.reshape(total, tf.shape(tensor))

    def all_gather(
        self, index: int, tensor: tf.Tensor, options: Options
    ) -> tf.Tensor:
        """Every member's `tensor` (same shapes) concatenated on axis 0.

        Members come in TensorFlow's group order: worker by worker, and
        each worker's devices in order.
        """
        with tf.device(self.devices[index]):
            wire = _on_the_wire(tensor)
            gathered = _launch(
                self.devices[index],
                tf_internal.collective_ops().all_gather_v2,
                wire,
                name=f"{self.name}_all_gather",
                **self._common(index, options),
            )
            if wire is tensor:
                return gathered
            return tf.cast(gathered, tensor.dtype)

    def all_gather_ragged(
        self, index: int, tensor: tf.Tensor, options: Options
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Every member's `tensor` concatenated on axis 0, any first dims.

        Each member pads its tensor to the longest first dimension in the
        group, all-gathers, and drops the padding.

        Returns:
            (the concatenation, each member's first dimension).
        """
        with tf.device(self.devices[index]):
            rows = tf.shape(tensor, out_type=tf.int64)[:1]
            all_rows = self.all_gather(index, rows, options)
            longest = tf.reduce_max(all_rows)
            padding = tf.concat(
                [
                    [[0, longest - rows[0]]],
                    tf.zeros([tf.rank(tensor) - 1, 2], tf.int64),
                ],
                axis=0,
            )
            padded = tf.pad(tensor, padding)
            gathered = self.all_gather(index, padded, options)
            keep = tf.reshape(tf.sequence_mask(all_rows, longest), [-1])
            return tf.boolean_mask(gathered, keep), all_rows


# The dtypes TensorFlow's collective kernels take, and what others travel as
# (exactly: every value of the narrower type is one of the wider).
_WIRE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
_WIDENED = {
    tf.bfloat16: tf.float32,
    tf.int8: tf.int32,
    tf.int16: tf.int32,
    tf.uint8: tf.int32,
    tf.uint16: tf.int32,
    tf.uint32: tf.int64,
}


def _on_the_wire(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` itself if the kernels take its dtype, else widened."""
    if tensor.dtype in _WIRE_DTYPES:
        return tensor
    if tensor.dtype in _WIDENED:
        return tf.cast(tensor, _WIDENED[tensor.dtype])
    raise TypeError(
        f"values: TensorFlow's collective ops cannot carry {tensor.dtype.name}"
        "; expected one of "
        f"{', '.join(d.name for d in (*_WIRE_DTYPES, *_WIDENED))}"
    )


def _log_uncompressed(name: str, size: int) -> None:
    if (name, size) in _logged_uncompressed:
        return
    _logged_uncompressed.add((name, size))
    logging.warning(
        "tf_crossdevice: %s: compression is off for a group of %d members: "
        "gathering 16-bit messages would move more bytes than the "
        "uncompressed ring (it pays for 2 or 3 members); all-reducing "
        "exactly",
        name,
        size,
    )


_logged_uncompressed: set[tuple[str, int]] = set()


def _as_half_words(part: tf.Tensor) -> tf.Tensor:
    """`part`'s bytes as a flat float16 tensor (all-gather copies bits).

    The gather kernel takes float16 but not bfloat16 (TensorFlow 2.21);
    a 32-bit scale becomes two words.
    """
    if part.dtype == tf.float16:
        return tf.reshape(part, [-1])
    return tf.reshape(tf.bitcast(part, tf.float16), [-1])


def _from_half_words(words: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """`_as_half_words`' inverse: a tensor of `like`'s dtype and shape."""
    if like.dtype == tf.float16:
        flat = words
    elif like.dtype.size == 2:
        flat = tf.bitcast(words, like.dtype)
    else:
        flat = tf.bitcast(
            tf.reshape(words, [-1, like.dtype.size // 2]), like.dtype
        )
    shape = like.shape if like.shape.is_fully_defined() else tf.shape(like)
    return tf.reshape(flat, shape)


def _static_or_dynamic_size(tensor: tf.Tensor) -> Any:
    size = tensor.shape.num_elements()
    return size if size is not None else tf.size(tensor)


# TF 1 graph -> device -> its last collective op so far.
_last_in_graph: weakref.WeakKeyDictionary[Any, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)


def _launch(device: str, op: Any, *args: Any, **kwargs: Any) -> tf.Tensor:
    """`op(*args, **kwargs)`, after the device's previous collective
    (and recorded as entered, for a launcher that watches: `_entering`).

    In TF 2 the ordering token orders a device's collectives. A TF 1 graph
    gets a control edge from each device's previous collective instead:
    unordered, two devices can each start a different collective first and
    wait for each other for good.
    """
    if tf.compat.v1.executing_eagerly_outside_functions():
        return _entering.launch(device, op, args, **kwargs)
    last = _last_in_graph.setdefault(tf.compat.v1.get_default_graph(), {})
    previous = [last[device]] if device in last else []
    with tf.control_dependencies(previous):
        out = _entering.launch(device, op, args, **kwargs)
    last[device] = out.op
    return out


def hint(options: Options, device: str) -> str:
    """The communication hint for `device`: NCCL only on GPUs."""
    implementation = options.implementation
    if implementation == _NCCL and not _is_gpu(device):
        _log_nccl_fallback()
        return "ring"
    return implementation.value.lower()


def _is_gpu(device: str) -> bool:
    return devices_lib.parse_device(device).device_type == "GPU"


def _log_nccl_fallback() -> None:
    logging.log_first_n(
        logging.WARNING,
        "tf_crossdevice: implementation=NCCL needs GPUs; collectives on "
        "other devices use RING",
        1,
    )
