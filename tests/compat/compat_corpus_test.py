"""Legacy scripts give the same numbers before and after the migration command.

Each script in tests/compat/corpus/ prints its numbers as one JSON line. The
runnable ones (2018 and TF 2.2 code whose one changed import reaches
tf_crossdevice.compat) run as they are; a copy upgraded with --in_place runs
too, and must print the same numbers, which numpy also computes. The
contrib scripts cannot run before the upgrade; their upgraded copies must
match numpy. Every script runs in its own process, all at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

from tf_crossdevice.cluster import processes
from tf_crossdevice.compat import upgrade

pytestmark = pytest.mark.slow

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
TIMEOUT_SECONDS = 120
# Runs a script as `python FILE` would, then fails if it imported the
# legacy layer.
NO_COMPAT = (
    "import runpy, sys\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
    "assert 'tf_crossdevice.compat' not in sys.modules, "
    "'imported tf_crossdevice.compat'\n"
)
LEGACY_WORDS = (
    "compat",
    "contrib",
    "CrossTower",
    "VariableAggregation",
    "experimental_hints",
    "CollectiveHints",
)


def expected_training():
    """mirrored_training.py's SGD in float64: 4 equal shards, so the mean of
    the replicas' gradients is the whole batch's gradient."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(32, 3)).astype(np.float32)
    true_weights = np.array([[1.0], [-2.0], [0.5]], np.float32)
    labels = (features @ true_weights + np.float32(0.3)).astype(np.float64)
    features = features.astype(np.float64)
    weights, bias = np.zeros([3, 1]), 0.0
    for _ in range(5):
        error = features @ weights + bias - labels
        loss = np.mean(error**2)
        weights -= 0.1 * 2 * features.T @ error / len(error)
        bias -= 0.1 * 2 * np.mean(error)
    return {"weights": weights.ravel(), "bias": bias, "loss": loss}


def expected_spec():
    """Replica i holds (i + 1) * x: the sum is 10 x, the mean 2.5 x."""
    large = 10 * np.arange(1000.0)
    return {
        "small_sum": np.full(4, 10.0),
        "large_sum_total": large.sum(),
        "large_sum_last": large[-1],
        "large_mean_last": [2.5 * 999] * 4,
    }


def expected_hints():
    x = np.array([1.0, 2.0, 3.0])
    return {
        "total": [10 * x],
        "mean": [2.5 * x] * 4,
        "mean_square": [7.5 * x**2] * 4,  # mean((i + 1)^2) = 7.5
        "collective_total": [10 * x] * 4,
    }


def expected_contrib():
    x = np.array([1.0, 10.0])
    return {
        "ring_sum": [10 * x] * 4,
        "best_mean": [2.5 * x],
        "spec_sum": [10 * x],
    }


def expected_field():
    """Replica i holds (i + 1) x; one strategy on no GPU has one replica."""
    x = np.array([1.0, 10.0])
    return {
        "nccl_sum": [10 * x] * 4,
        "strategy_sum": 10 * x,
        "one_device_mean": [2.5 * x],
        "spec_sum": [10 * x],
        "single_replicas": 1,
    }


RUNNABLE = {
    "mirrored_training.py": expected_training,
    "multi_worker_spec.py": expected_spec,
    "collective_hints.py": expected_hints,
}
CONTRIB_ONLY = {
    # One replica on the whole batch: the same SGD as the 4 replicas'.
    "collective_strategy.py": expected_training,
    "contrib_cross_tower_ops.py": expected_contrib,
    "field_patterns.py": expected_field,
}
EXPECTED = {**RUNNABLE, **CONTRIB_ONLY}


def test_the_corpus_is_what_this_file_checks():
    assert sorted(p.name for p in CORPUS.glob("*.py")) == sorted(EXPECTED)


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory):
    """The corpus upgraded in place in a copy: (folder, exit status, stdout)."""
    folder = tmp_path_factory.mktemp("corpus")
    for name in EXPECTED:
        shutil.copy(CORPUS / name, folder / name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = upgrade.main([str(folder), "--in_place"])
    return folder, status, out.getvalue()


@pytest.fixture(scope="module")
def outputs(upgraded):
    """(name, "original" or "upgraded") -> its stdout lines, or the error.

    Every script starts at once; a failed original (the legacy layer) does
    not hide the upgraded scripts' results.
    """
    folder, _, _ = upgraded
    runs = {}
    for name in EXPECTED:
        if name in RUNNABLE:
            runs[name, "original"] = [sys.executable, str(CORPUS / name)]
        runs[name, "upgraded"] = [
            sys.executable,
            "-c",
            NO_COMPAT,
            str(folder / name),
        ]
    # On top of child_env(): PYTHONPATH is the repository root.
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    children = {
        key: processes.Child(argv, name=f"{key[0]} ({key[1]})", env=env)
        for key, argv in runs.items()
    }
    results = {}
    try:
        for key, child in children.items():
            try:
                results[key] = child.read_all(TIMEOUT_SECONDS)
            except processes.ChildError as error:
                results[key] = error
    finally:
        processes.stop_all(list(children.values()))
    return results


def numbers(outputs, name, kind):
    result = outputs[name, kind]
    if isinstance(result, Exception):
        raise result
    return json.loads(result[-1])


def assert_same(actual, expected):
    assert sorted(actual) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(
            np.asarray(actual[key], np.float64),
            np.asarray(expected[key], np.float64),
            rtol=1e-5,
            atol=1e-6,
            err_msg=key,
        )


def test_the_upgrade_converts_everything(upgraded):
    _, status, out = upgraded
    assert status == 0
    assert out.splitlines()[-1] == (
        f"{len(EXPECTED)} files scanned, {len(EXPECTED)} files changed, "
        f"{out.count(': changed ')} changes, 0 not converted, 0 unparsable"
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_upgraded_script_has_no_legacy_names(upgraded, name):
    folder, _, _ = upgraded
    source = (folder / name).read_text()
    for word in LEGACY_WORDS:
        assert word not in source, f"{name} still says {word!r}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_upgraded_script_matches_numpy(outputs, name):
    # Its run also checked that tf_crossdevice.compat was never imported.
    assert_same(numbers(outputs, name, "upgraded"), EXPECTED[name]())


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_original_script_matches_numpy_and_its_upgrade(outputs, name):
    original = numbers(outputs, name, "original")
    assert_same(original, RUNNABLE[name]())
    upgraded = numbers(outputs, name, "upgraded")
    for key in original:
        np.testing.assert_allclose(
            np.asarray(upgraded[key]), np.asarray(original[key]), rtol=1e-6
        )


def test_upgrading_again_changes_nothing(upgraded, capsys):
    folder, _, _ = upgraded
    status = upgrade.main([str(folder)])
    out = capsys.readouterr().out
    assert status == 0
    assert out == (
        f"{len(EXPECTED)} files scanned, 0 files changed, 0 changes, "
        "0 not converted, 0 unparsable\n"
    )
