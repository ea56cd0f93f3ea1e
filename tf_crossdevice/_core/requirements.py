"""The package's version, and the TensorFlow it needs, checked on import.

The package never installs TensorFlow itself unless asked through an extra
(`tf_crossdevice[cpu]`, `[gpu]`, `[tensorflow]`), so that it works with
whichever TensorFlow 2.21 wheel the user already has. This module says
what to install when none, or another version, is found.
"""

from __future__ import annotations

__version__ = "0.1.0"

SUPPORTED_TENSORFLOW = "2.21"
_INSTALL = (
    "install one TensorFlow 2.21 wheel, e.g. "
    "`pip install 'tensorflow-cpu==2.21.*'`, or from a checkout of "
    "tf_crossdevice `pip install -e '.[cpu]'` (tensorflow-cpu), "
    "`pip install -e '.[gpu]'` (tensorflow[and-cuda]) or "
    "`pip install -e '.[tensorflow]'`"
)


def check_tensorflow_version(version: str) -> None:
    """Raises ImportError unless `version` is a TensorFlow 2.21 release.

    >>> check_tensorflow_version("2.21.0")
    >>> check_tensorflow_version("2.16.1")
    Traceback (most recent call last):
    ...
    ImportError: tf_crossdevice 0.1.0 needs TensorFlow 2.21, found 2.16.1; ...
    """
    if version.split(".")[:2] != SUPPORTED_TENSORFLOW.split("."):
        raise ImportError(
            f"tf_crossdevice {__version__} needs TensorFlow "
            f"{SUPPORTED_TENSORFLOW}, found {version}; {_INSTALL}"
        )


def require_tensorflow() -> None:
    """Raises ImportError naming what to install when TensorFlow is missing
    or is not 2.21.

    The version is read from the installed distribution when there is one
    (so a missing TensorFlow is told apart from a broken one) and from
    `tf.__version__` otherwise.
    """
    try:
        # Deferred: without TensorFlow, the import error must become the
        # message that says what to install.
        import tensorflow as tf
    except ImportError as error:
        if isinstance(error, ModuleNotFoundError) and error.name in (
            "tensorflow",
            None,
        ):
            raise ImportError(
                f"tf_crossdevice needs TensorFlow, which is not installed; "
                f"{_INSTALL}"
            ) from error
        raise
    check_tensorflow_version(tf.__version__)
