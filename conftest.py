"""Gives every test process 8 logical CPU devices before TensorFlow starts.

Tests use subsets of these (1, 2, 3, 4 and 8 devices); see
tf_crossdevice.testing. Doctests get `tf`, `np` and `tf_crossdevice`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_crossdevice  # noqa: E402
from tf_crossdevice import testing  # noqa: E402

testing.request_cpu_devices(8)

# Legacy scripts that tests/compat_corpus_test.py runs as programs; one is TF
# 1 code that cannot be imported (--doctest-modules would) before upgrading.
collect_ignore = ["tests/compat_corpus"]


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    doctest_namespace.update(tf=tf, np=np, tf_crossdevice=tf_crossdevice)
