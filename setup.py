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
    # TensorFlow is not a requirement: the package works with whichever
    # TensorFlow 2.21 wheel the user has (tensorflow, tensorflow-cpu, a CUDA
    # build) and must never install a second one over it. The extras below
    # name the choices; importing tf_crossdevice without any raises an
    # ImportError that says which to install (_core/requirements.py).
    install_requires=[
        "absl-py>=1.0",
        "numpy>=1.26",
        # Worker processes (tf_crossdevice/cluster/processes.py): portpicker
        # picks free ports, psutil finds a worker's process tree to stop it
        # whole.
        "portpicker>=1.6",
        "psutil>=5.9",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu~=2.21.0"],
        "gpu": ["tensorflow[and-cuda]~=2.21.0"],
        "tensorflow": ["tensorflow~=2.21.0"],
        # To view the TensorBoard scalars that the example job writes (it
        # prints `tensorboard --logdir=...`; scripts/run_example.sh installs
        # this extra): TensorFlow 2.21's wheels no longer pull TensorBoard in.
        "tensorboard": ["tensorboard~=2.21.0"],
        # matplotlib draws the benchmark's time-vs-size plot; tqdm is its
        # progress bar (a full run takes a long time); SciPy fits the cost
        # model to its records (benchmarks/cost_fit.py).
        "benchmark": ["matplotlib>=3.8", "tqdm>=4.66", "scipy>=1.11"],
        # cost_model.fit solves for the constants with SciPy's
        # non-negative least squares; nothing else in the package needs it.
        "fit": ["scipy>=1.11"],
        # python -m tf_crossdevice.compat.upgrade rewrites code with libcst,
        # which keeps comments and formatting (ast would drop them).
        "upgrade": ["libcst>=1.1"],
        # One launcher per machine (tf_crossdevice.cluster.run_host_agent)
        # meets the others through a rendezvous on an etcd server, which it
        # talks to over etcd's HTTP gateway with etcd3gw (maintained, pure
        # Python; the gRPC client `etcd3` has had no release since 2020).
        "elastic": ["etcd3gw>=2.4"],
        "test": [
            "pytest>=8",
            # Runs the suite on both cores of a small machine.
            "pytest-xdist>=3",
            "hypothesis>=6.100",
            "matplotlib>=3.8",
            "tqdm>=4.66",
            # The cost model's fit (the `fit` extra).
            "scipy>=1.11",
            # tests/compat/compat_upgrade_test.py runs the migration command.
            "libcst>=1.1",
            # tests/examples/timeline_flag_test.py reads where a hung job's
            # workers wait without stopping them.
            "py-spy>=0.3",
            # tests/cluster/rendezvous_test.py (the `elastic` extra).
            "etcd3gw>=2.4",
        ],
        # Pinned: a new release's rules would otherwise fail CI on its own.
        # import-linter checks the layering (.importlinter).
        "dev": [
            "ruff==0.17.6",
            "mypy==2.4.1",
            "types-psutil>=7.0",
            "import-linter==2.17",
        ],
        # The documentation site (mkdocs.yml), built with --strict in CI.
        # Its hook (benchmarks/mkdocs_hooks.py) draws the benchmark page's
        # plots with matplotlib and imports the package, so the build also
        # needs a TensorFlow (an extra above, e.g. `.[cpu,docs]`); ruff
        # formats the API pages' signatures (as pinned in `dev`).
        "docs": [
            "mkdocs==1.6.1",
            "mkdocs-material==9.6.23",
            "mkdocstrings[python]==0.30.1",
            "matplotlib>=3.8",
            "ruff==0.17.6",
        ],
    },
    classifiers=["Programming Language :: Python :: 3"],
)
