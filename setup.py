"""Installs tf_crossdevice."""

import pathlib

import setuptools

README = pathlib.Path(__file__).parent / "README.md"

setuptools.setup(
    name="tf_crossdevice",
    version="0.1.0",
    description=(
        "TensorFlow 1's cross-device all-reduce algorithms as "
        "tf.distribute.CrossDeviceOps for TensorFlow 2."
    ),
    long_description=README.read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    # The legacy layer lives in the top-level compat/ folder, apart from the
    # core, and installs as tf_crossdevice.compat (in a wheel and in an
    # editable install alike).
    packages=[
        *setuptools.find_packages(
            include=["tf_crossdevice", "tf_crossdevice.*"]
        ),
        "tf_crossdevice.compat",
    ],
    package_dir={"tf_crossdevice.compat": "compat"},
    package_data={"tf_crossdevice": ["py.typed"]},
    python_requires=">=3.10",
    # The full tensorflow wheel runs on CPU-only machines and on GPUs (add
    # tensorflow[and-cuda] for the CUDA libraries), so one requirement serves
    # both; users who already have tensorflow-cpu 2.21 can install with
    # --no-deps.
    install_requires=[
        "tensorflow~=2.21.0",
        "absl-py>=1.0",
        "numpy>=1.26",
        # Worker processes (tf_crossdevice/_processes.py): portpicker picks
        # free ports, psutil finds a worker's process tree to stop it whole.
        "portpicker>=1.6",
        "psutil>=5.9",
    ],
    extras_require={
        # pytest-xdist runs the suite on both cores of a small machine.
        # matplotlib draws the benchmark's time-vs-size plot; tqdm is its
        # progress bar (a full run takes a long time).
        "benchmark": ["matplotlib>=3.8", "tqdm>=4.66"],
        # python -m tf_crossdevice.compat.upgrade rewrites code with libcst,
        # which keeps comments and formatting (ast would drop them).
        "upgrade": ["libcst>=1.1"],
        "test": [
            "pytest>=8",
            "pytest-xdist>=3",
            "hypothesis>=6.100",
            "matplotlib>=3.8",
            "tqdm>=4.66",
            # tests/compat_upgrade_test.py runs the migration command.
            "libcst>=1.1",
        ],
        # Pinned: a new release's rules would otherwise fail CI on its own.
        "dev": ["ruff==0.17.6", "mypy==2.4.1", "types-psutil>=7.0"],
    },
    classifiers=["Programming Language :: Python :: 3"],
)
