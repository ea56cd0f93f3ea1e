"""select_cross_device_ops on this machine's GPUs, from the links that
TensorFlow reports between them, and the chosen object's numbers.

The rule (tf_crossdevice.select_cross_device_ops' docstring): GPUs of one
worker whose links are DGX-1-like get HierarchicalCopyAllReduce with 8
packs, other GPUs of one worker NcclAllReduce with 1 pack, any CPU among
them SpecAllReduce("pscpu").
"""

from tensorflow.python.client import device_lib

import tf_crossdevice
from tests.gpu import gpu_util


def links_from_device_lib() -> dict[str, list[int]]:
    """Each GPU's canonical name -> the GPU ids TensorFlow links it to."""
    return {
        gpu_util.canonical(d.name): [
            link.device_id for link in d.locality.links.link
        ]
        for d in device_lib.list_local_devices()
        if d.device_type == "GPU"
    }


@gpu_util.needs_gpus(1)
def test_every_gpu_gets_the_rule_of_its_link_matrix():
    devices = gpu_util.gpu_names(gpu_util.gpu_count())
    links = links_from_device_lib()
    chosen = tf_crossdevice.select_cross_device_ops(devices)
    want = gpu_util.rule_for_links(devices, links)
    assert gpu_util.describe_ops(chosen) == want, links
    problem = gpu_util.all_reduce_problem(lambda: chosen, len(devices))
    assert problem is None, f"{want} on {len(devices)} GPUs: {problem}"


@gpu_util.needs_gpus(1)
def test_a_cpu_among_the_gpus_gets_pscpu():
    devices = [*gpu_util.gpu_names(1), *tf_crossdevice.testing.cpu_devices(1)]
    chosen = tf_crossdevice.select_cross_device_ops(devices)
    assert type(chosen).__name__ == "SpecAllReduce"
