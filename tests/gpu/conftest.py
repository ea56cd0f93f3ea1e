"""Sets up the GPUs of a pytest process before TensorFlow initialises.

With `gpu_util.LOGICAL_GPUS_ENV` set to N (gpu_logical_gpus_test.py sets it
for the nested run of the contract), GPU:0 becomes N logical GPUs and the
other GPUs are hidden. Otherwise each GPU's memory grows as needed, so that
the child processes of gpu_logical_gpus_test.py find room on GPU:0.
"""

from tests.gpu import gpu_util

if gpu_util.split_count():
    gpu_util.split_gpu(gpu_util.split_count())
else:
    gpu_util.grow_gpu_memory()
