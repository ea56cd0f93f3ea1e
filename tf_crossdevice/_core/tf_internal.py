"""Every TensorFlow private this package touches, in one place.

Checked against TensorFlow 2.21. TensorFlow exposes no public constructor for
PerReplica / Mirrored values, no public device canonicaliser and no public
NCCL op wrapper, and no public reader of the profiler's files (XSpace);
everything else in tf_crossdevice uses the public API.
"""

from __future__ import annotations

import copy

import tensorflow as tf
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.client import device_lib
from tensorflow.python.distribute import (
    collective_all_reduce_strategy,
    collective_util,
    cross_device_utils,
    device_util,
    distribute_lib,
)
from tensorflow.python.distribute import multi_worker_util as _multi_worker_util
from tensorflow.python.distribute import values as _values
from tensorflow.python.eager import context as _context
from tensorflow.python.framework import ops as _framework_ops
from tensorflow.python.ops import collective_ops as _collective_ops
from tensorflow.python.ops import resource_variable_ops
from tensorflow.tsl.profiler.protobuf import xplane_pb2

PerReplica = _values.PerReplica
Mirrored = _values.Mirrored
DistributedValues = _values.DistributedValues
# tf.distribute.experimental.CommunicationOptions(...) builds one of these.
CommunicationOptions = collective_util.Options


def canonicalize_device(device: str) -> str:
    """Full device name, e.g. '/job:localhost/replica:0/task:0/device:CPU:1'."""
    return device_util.canonicalize(device)


def resolve_device(device: str) -> str:
    """`device` completed from the enclosing `tf.device` scope, canonical.

    What TensorFlow's CrossDeviceOps do with destination strings: under
    `tf.device("/job:worker/task:1")`, "/cpu:0" is task 1's CPU.
    """
    return device_util.resolve(device)


def nccl_all_sum(tensors):
    """TensorFlow's NCCL all-reduce (sum) over tensors on distinct GPUs."""
    # Deferred: importing nccl_ops registers the NCCL kernels, which only a
    # GPU job that asks for NCCL needs.
    from tensorflow.python.ops import nccl_ops

    return nccl_ops.all_sum(tensors)


def local_gpu_links() -> dict[str, list[int]]:
    """Each local GPU's canonical name -> the TF GPU ids it has links to."""
    links = {}
    for device in device_lib.list_local_devices():
        if device.device_type == "GPU":
            links[canonicalize_device(device.name)] = [
                link.device_id for link in device.locality.links.link
            ]
    return links


# ---- Collective ops across worker processes -----------------------------
# TensorFlow's own MultiWorkerMirroredStrategy drives these privates; the
# collective classes and tf_crossdevice.MultiWorkerMirroredStrategy use the
# same ones, with the same arguments.


def collective_ops():
    """TensorFlow's v2 collective ops (all_reduce_v2, all_gather_v2, ...)."""
    return _collective_ops


def eager_context():
    """The process's eager context (collective configuration, peer health)."""
    return _context.context()


def server_def(cluster_spec, job_name, task_index, protocol, port):
    """A ServerDef carrying the context's current session config."""
    return tensorflow_server_pb2.ServerDef(
        cluster=cluster_spec.as_cluster_def(),
        default_session_config=copy.deepcopy(eager_context().config),
        job_name=job_name,
        task_index=task_index,
        protocol=protocol,
        port=port,
    )


def multi_worker_util():
    """Cluster-spec helpers: worker_count, collective_leader, normalize."""
    return _multi_worker_util


def collective_keys(group_key_start=1):
    """TensorFlow's CollectiveKeys: group keys and per-device instance keys."""
    return cross_device_utils.CollectiveKeys(group_key_start=group_key_start)


def is_collective_keys(value) -> bool:
    return isinstance(value, cross_device_utils.CollectiveKeys)


def function_graph_being_built():
    """The enclosing tf.function's graph while tracing one, else None."""
    if tf.executing_eagerly():
        return None
    graph = _framework_ops.get_default_graph()
    while getattr(graph, "is_control_flow_graph", False):
        graph = graph.outer_graph
    return graph if getattr(graph, "building_function", False) else None


def new_resource_variable(initial_value, trainable=True, name=None):
    """A resource variable that no variable creator scope intercepts."""
    return resource_variable_ops.ResourceVariable(
        initial_value, trainable=trainable, name=name
    )


def multi_worker_strategy_parts():
    """(tf.distribute.Strategy's base, MWMS's extended class)."""
    return (
        distribute_lib.Strategy,
        collective_all_reduce_strategy.CollectiveAllReduceExtended,
    )


def read_xspace(path: str):
    """The profiler's XSpace (`<host>.xplane.pb`) at `path`."""
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space
