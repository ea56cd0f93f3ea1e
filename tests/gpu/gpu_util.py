"""What the GPU tests share: counting GPUs, skipping, logical GPUs.

Every test in tests/gpu/ needs GPUs. Where there are too few it skips with a
reason that says how many it needs and how many TensorFlow sees (and whether
the installed TensorFlow is a CUDA build at all: tensorflow-cpu sees none on
any machine). `bash scripts/run_gpu_checks.sh` runs them all.

Logical GPUs: TensorFlow can split one GPU into several (each with a memory
limit) before it initialises, as `tf_crossdevice.testing.request_cpu_devices`
does for the CPU. conftest.py does that for a whole pytest process when
`LOGICAL_GPUS_ENV` is set (gpu_logical_gpus_test.py runs the contract so), and
logical_gpus_child.py for one child process per device count.

Counting uses `tf.config.list_physical_devices`, which does not initialise
TensorFlow, so that a module can decide its skips when it is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import tensorflow as tf

from tests import contract
from tf_crossdevice._core import tf_internal
from tf_crossdevice.ops import _links
from tf_crossdevice.tuning import measure

# Set to N: this pytest process splits GPU:0 into N logical GPUs (conftest).
LOGICAL_GPUS_ENV = "TF_CROSSDEVICE_TEST_LOGICAL_GPUS"
# Each logical GPU's memory: the tests' tensors are small, and several
# processes may share one GPU (the children, pytest-xdist's workers).
LOGICAL_GPU_MEMORY_MB = 256


def physical_gpu_count() -> int:
    return len(tf.config.list_physical_devices("GPU"))


def split_count() -> int:
    """N when this process splits GPU:0 into N logical GPUs, else 0."""
    value = os.environ.get(LOGICAL_GPUS_ENV, "")
    return int(value) if value and physical_gpu_count() else 0


def gpu_count() -> int:
    """GPUs the tests of this process can place values on."""
    return split_count() or physical_gpu_count()


def describe_gpus() -> str:
    """What this process has, for skip reasons.

    >>> describe_gpus().startswith("this process sees ")
    True
    """
    physical = physical_gpu_count()
    text = f"this process sees {physical} GPU{'' if physical == 1 else 's'}"
    if split_count():
        text += f", GPU:0 split into {split_count()} logical GPUs"
    if not physical and not tf.sysconfig.get_build_info().get("is_cuda_build"):
        text += (
            f" (TensorFlow {tf.__version__} is not a CUDA build; install "
            "tensorflow[and-cuda])"
        )
    return text


def needs_gpus(
    n: int, *, physical: bool = False, why: str = ""
) -> pytest.MarkDecorator:
    """Skips unless the process has `n` GPUs (`physical`: distinct GPUs,
    not logical GPUs of one; NCCL refuses two ranks on one GPU)."""
    have = physical_gpu_count() if physical else gpu_count()
    kind = "physical GPU" if physical else "GPU"
    plural = "" if n == 1 else "s"
    return pytest.mark.skipif(
        have < n, reason=f"needs {n} {kind}{plural}{why}; {describe_gpus()}"
    )


def canonical(device: str) -> str:
    """The full name of a device string, e.g. '/gpu:1'."""
    return tf_internal.canonicalize_device(device)


def gpu_names(n: int, first: int = 0) -> list[str]:
    """Canonical names of GPUs first .. first + n - 1 (logical ones too)."""
    have = [d.name for d in tf.config.list_logical_devices("GPU")]
    if first + n > len(have):
        raise ValueError(
            f"n: asked for GPUs {first}..{first + n - 1}, this process has "
            f"{len(have)}"
        )
    return [canonical(d) for d in have[first : first + n]]


def split_gpu(n: int, memory_mb: int = LOGICAL_GPU_MEMORY_MB) -> None:
    """Makes GPU:0 the only GPU, as `n` logical GPUs (before TF starts).

    `TF_FORCE_GPU_ALLOW_GROWTH` is dropped: each logical GPU gets its fixed
    `memory_mb`, which bounds what the process takes of the GPU.

    Raises:
        RuntimeError: there is no GPU, or TensorFlow has initialised.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise RuntimeError(f"split_gpu({n}): {describe_gpus()}")
    os.environ.pop("TF_FORCE_GPU_ALLOW_GROWTH", None)
    tf.config.set_visible_devices(gpus[:1], "GPU")
    tf.config.set_logical_device_configuration(
        gpus[0],
        [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * n,
    )


def grow_gpu_memory() -> None:
    """Lets each GPU's memory grow as needed instead of taking it all, so
    that the children and the nested pytest run can share the GPUs; a no-op
    once TensorFlow has initialised (then the scripts' environment variable
    TF_FORCE_GPU_ALLOW_GROWTH has done it)."""
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            return


class ContractCase(contract.CrossDeviceOpsContract):
    """One contract case run by hand (outside pytest's collection)."""

    def __init__(self, make: Callable[[], tf.distribute.CrossDeviceOps]):
        self._make = make

    def make_ops(self) -> tf.distribute.CrossDeviceOps:
        return self._make()


def all_reduce_problem(
    make: Callable[[], tf.distribute.CrossDeviceOps], n: int
) -> str | None:
    """None if the contract's all-reduce case passes on GPUs 0 .. n-1, else
    what went wrong.

    The case (`test_all_reduce_every_device_count`): SUM and MEAN of five
    dtypes, dense and IndexedSlices, in eager mode, in a tf.function and in
    a TF 1 graph, against numpy; with 4 or more GPUs also many tensors of
    mixed shapes (`test_many_tensors_of_mixed_shapes`).
    """
    case = ContractCase(make)
    saved, contract.device_names = contract.device_names, gpu_names
    step = ""
    try:
        for mode in contract.MODES:
            step = mode
            case.test_all_reduce_every_device_count(n, mode)
        if n >= 4:
            step = "many tensors of mixed shapes"
            case.test_many_tensors_of_mixed_shapes()
    except Exception as e:  # noqa: BLE001 - the caller's assert reports it.
        return f"{step}: {type(e).__name__}: {measure.first_line(str(e), 600)}"
    finally:
        contract.device_names = saved
    return None


def describe_ops(ops: tf.distribute.CrossDeviceOps) -> str:
    """The class and its packs, e.g. 'NcclAllReduce(num_packs=1)'."""
    packs = getattr(ops, "_num_packs", None)
    return type(ops).__name__ + (
        "" if packs is None else f"(num_packs={packs})"
    )


def rule_for_links(devices: list[str], links: dict[str, list[int]]) -> str:
    """What `select_cross_device_ops` should pick for GPUs of one worker,
    by its docstring's rule, from the links TensorFlow reports (each GPU's
    canonical name -> the GPU ids it links to)."""
    ids = [int(d.rsplit(":", 1)[1]) for d in devices]
    matrix = [[j in links.get(d, []) for j in ids] for d in devices]
    if _links.is_dgx1_like(matrix):
        return "HierarchicalCopyAllReduce(num_packs=8)"
    return "NcclAllReduce(num_packs=1)"
