"""autotune: a verified choice within the budget, cached, numbers vs numpy."""

from __future__ import annotations

import json
import logging
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.python.eager.polymorphic_function import polymorphic_function

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice.tuning import (
    _autotune,
    _cache,
    _candidates,
    _configs,
    _topology,
    measure,
)

# A few small tensors of two dtypes: cheap to trace, every packing applies.
GRADIENTS = [
    ((3, 4), "float32"),
    ((50,), "float32"),
    ((7,), "float64"),
    ((2, 2), "float32"),
    ((5,), "int64"),
]
BUDGET = 1.5  # seconds: a handful of candidates at most


class PrepareSpy:
    """Counts the candidates autotune builds (`measure.prepare` calls)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = measure.prepare

        def prepare(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(measure, "prepare", prepare)


def batch_sums_like_numpy(ops, devices, gradients=GRADIENTS, seed=0):
    """Reduces random values of `gradients`' shapes with `ops`; asserts
    every replica's result is numpy's sum."""
    rng = np.random.default_rng(seed)
    arrays = [
        [
            rng.integers(-50, 50, size=shape).astype(dtype)
            for _ in range(len(devices))
        ]
        for shape, dtype in gradients
    ]
    values = [
        testing.per_replica([tf.constant(a) for a in per], devices)
        for per in arrays
    ]
    results = ops.batch_reduce("sum", [(v, v) for v in values])
    for per, result in zip(arrays, results, strict=True):
        components = result.values
        assert len(components) == len(devices)
        for component, device in zip(components, devices, strict=True):
            assert component.device == device
            np.testing.assert_array_equal(component.numpy(), np.sum(per, 0))


@pytest.mark.parametrize("num_devices", [2, 4])
def test_tiny_budget_gives_a_verified_choice_that_sums_like_numpy(
    num_devices, tmp_path, monkeypatch
):
    spy = PrepareSpy(monkeypatch)
    devices = testing.cpu_devices(num_devices)
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=BUDGET, cache_dir=tmp_path
    )
    result = ops.autotune_result
    timed = [m for m in result.measurements if m.median_seconds is not None]
    assert timed and all(m.verified for m in timed)
    assert spy.calls >= len(timed)
    # The fastest of the confirmed finalists (of all, if none confirmed).
    confirmed = [m for m in timed if m.confirmation_rounds]
    fastest = min(confirmed or timed, key=lambda m: m.median_seconds)
    assert result.config == fastest.config and not result.from_cache
    assert type(ops).__name__ == result.config[0]
    # The candidates left out say why; the budget was the reason.
    skipped = [m for m in result.measurements if m.verified is None]
    assert all("budget" in m.error for m in skipped)
    assert result.complete == (not skipped)
    batch_sums_like_numpy(ops, devices)


def test_second_call_reads_the_cache_and_builds_nothing(tmp_path, monkeypatch):
    devices = testing.cpu_devices(2)
    first = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=BUDGET, cache_dir=tmp_path
    )
    (cache_file,) = tmp_path.glob("*.json")
    assert first.autotune_result.cache_file == str(cache_file)
    stored = json.loads(cache_file.read_text())
    assert _configs.from_json(stored["config"]) == first.autotune_result.config
    spy = PrepareSpy(monkeypatch)
    lines = []
    # At WARNING, which absl shows by default.
    monkeypatch.setattr(
        absl_logging, "warning", lambda msg, *args: lines.append(msg % args)
    )
    second = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=BUDGET, cache_dir=tmp_path
    )
    assert spy.calls == 0
    # One line says the choice came from the cache, and where that is.
    (line,) = lines
    assert f"read from the cache file {cache_file} " in line
    assert f"with a {BUDGET:g} s budget" in line
    # It prints as the public constructor call of the configuration.
    name, kwargs = second.autotune_result.config
    assert repr(second) == repr(getattr(tf_crossdevice, name)(**kwargs))
    assert repr(second).startswith(f"{name}(")
    assert second.autotune_result.from_cache
    assert second.autotune_result.config == first.autotune_result.config
    assert second is not first
    batch_sums_like_numpy(second, devices, seed=1)


def test_autotune_logs_no_retracing_warning(tmp_path, monkeypatch, caplog):
    """Six candidates (more than the 5 traces TensorFlow tolerates of one
    function) each trace their own step functions once: none of them is a
    function retraced."""
    # TensorFlow warns at most twice per function over the process's life:
    # a fresh count, so that earlier tests cannot have used them up.
    monkeypatch.setattr(
        polymorphic_function,
        "_frequent_tracing_detector_manager",
        polymorphic_function._FrequentTracingDetectorManager(),
    )
    monkeypatch.setattr(_autotune, "time", TenthSpeedClock())
    candidates = _candidates.timed_candidates
    monkeypatch.setattr(
        _candidates, "timed_candidates", lambda t, g: candidates(t, g)[:6]
    )
    spy = PrepareSpy(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        tf_crossdevice.autotune(
            GRADIENTS,
            testing.cpu_devices(2),
            budget_seconds=3,
            cache_dir=tmp_path,
        )
    assert spy.calls == 6
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]


def test_the_cache_key_ignores_device_names_but_not_the_gradients(tmp_path):
    two = _topology.Topology.of(testing.cpu_devices(2))
    other = _topology.Topology.of(["/cpu:2", "/cpu:3"])
    four = _topology.Topology.of(testing.cpu_devices(4))
    grads = _topology.normalize_gradients(GRADIENTS)
    key = _cache.cache_file
    assert key(two, grads, tmp_path) == key(other, grads, tmp_path)
    assert key(two, grads, tmp_path) != key(four, grads, tmp_path)
    assert key(two, grads, tmp_path) != key(two, grads[::-1], tmp_path)


def test_a_keras_model_is_its_trainable_weights(tmp_path, monkeypatch):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.add(keras.layers.Dense(2, use_bias=False))
    grads = _topology.normalize_gradients(model)
    assert grads == [
        ((6, 3), "float32"),
        ((3,), "float32"),
        ((3, 2), "float32"),
    ]
    # The same gradients as a list hit the cache the model's call wrote.
    devices = testing.cpu_devices(2)
    ops = tf_crossdevice.autotune(
        model, devices, budget_seconds=0.5, cache_dir=tmp_path
    )
    batch_sums_like_numpy(ops, devices, gradients=grads)
    spy = PrepareSpy(monkeypatch)
    variables = [tf.Variable(tf.zeros(s, d)) for s, d in grads]
    again = tf_crossdevice.autotune(
        variables, devices, budget_seconds=0.5, cache_dir=tmp_path
    )
    assert spy.calls == 0 and again.autotune_result.from_cache


OLD_FORMAT = {
    "format": 0,
    "config": ["ReductionToOneDevice", {}],
    "label": "ReductionToOneDevice",
    "budget_seconds": 100.0,
    "complete": True,
}


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"format": 1, "config": ["NoSuchAllReduce", {}]', "corrupt"),
        ('{"format": 1, "config": 3}', "corrupt"),
        ("[1, 2]", "corrupt"),
        (json.dumps(OLD_FORMAT), "of format 0"),
    ],
    ids=["truncated", "bad_config", "not_a_dict", "old_format"],
)
def test_a_corrupt_cache_file_is_ignored_with_a_warning(
    text, why, tmp_path, monkeypatch
):
    devices = testing.cpu_devices(2)
    topology = _topology.Topology.of(devices)
    grads = _topology.normalize_gradients(GRADIENTS)
    path = _cache.cache_file(topology, grads, tmp_path)
    path.write_text(text)
    warnings = []
    monkeypatch.setattr(
        absl_logging,
        "warning",
        lambda msg, *args: warnings.append(msg % args),
    )
    spy = PrepareSpy(monkeypatch)
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=0.5, cache_dir=tmp_path
    )
    assert spy.calls >= 1
    assert len(warnings) == 1 and str(path) in warnings[0]
    assert why in warnings[0]
    # Rewritten whole (atomically: no temporary file left behind).
    assert json.loads(path.read_text())["format"] == _cache.CACHE_FORMAT
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    batch_sums_like_numpy(ops, devices)


def test_a_larger_budget_measures_again_when_candidates_were_left_out(
    tmp_path, monkeypatch
):
    devices = testing.cpu_devices(2)
    topology = _topology.Topology.of(devices)
    grads = _topology.normalize_gradients(GRADIENTS)
    entry = {
        "format": _cache.CACHE_FORMAT,
        "config": ["ReductionToOneDevice", {}],
        "label": "ReductionToOneDevice",
        "budget_seconds": 0.1,
        "complete": False,
    }
    _cache.write_cache(_cache.cache_file(topology, grads, tmp_path), entry)
    spy = PrepareSpy(monkeypatch)
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=0.1, cache_dir=tmp_path
    )
    assert spy.calls == 0 and type(ops) is tf_crossdevice.ReductionToOneDevice
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=0.5, cache_dir=tmp_path
    )
    assert spy.calls >= 1 and not ops.autotune_result.from_cache


def test_make_ops_builds_each_class_and_refuses_unknown_ones():
    topology = _topology.Topology.of(testing.cpu_devices(2))
    ops = _configs.make_ops(
        ("SpecAllReduce", {"all_reduce_spec": ["xring", 2, -1]}), topology
    )
    assert ops.all_reduce_spec[0].shards == 2
    with pytest.raises(ValueError, match="config: unknown class 'Ring'.*"):
        _configs.make_ops(("Ring", {}), topology)
    with pytest.raises(TypeError, match="config: expected"):
        _configs.make_ops("xring", topology)


def test_compressed_candidates_are_checked_within_the_codecs_rounding():
    inputs = measure.Inputs([((6,), "float32"), ((3,), "int64")], ["/cpu:0"])
    want = [np.asarray(e) for e in inputs.expected]
    check = inputs.check_close(2**-4)
    devices = [[inputs.devices[0]]] * 2
    near = [[want[0] * (1 + 2**-6)], [want[1]]]
    assert check(near, devices) is None
    assert "tolerance" in check([[want[0] + 100], [want[1]]], devices)
    # Integers are never compressed: exact.
    assert "differ" in check([[want[0]], [want[1] + 1]], devices)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"gradients": []}, ValueError, "gradients: .*empty list"),
        ({"gradients": "w"}, TypeError, "gradients: expected a Keras model"),
        ({"gradients": 3}, TypeError, "gradients: expected a Keras model"),
        ({"gradients": [((2,), "float32"), 5]}, TypeError, r"gradients\[1\]"),
        (
            {"gradients": [((None, 2), "float32")]},
            ValueError,
            r"gradients\[0\]: shape \(None, 2\) is not fully known",
        ),
        ({"gradients": [((2,), "floaty")]}, ValueError, r"gradients\[0\]"),
        ({"gradients": [[3, 4]]}, TypeError, r"gradients\[0\]: .*dtype"),
        ({"devices": "/cpu:0"}, TypeError, "devices: expected a list"),
        ({"devices": []}, ValueError, "devices: expected at least one"),
        ({"devices": ["/cpu:0", 1]}, TypeError, r"devices\[1\]"),
        ({"devices": ["/cpu:99"]}, ValueError, r"devices\[0\].*not a device"),
        ({"devices": ["/cpu:0", "/cpu:0"]}, ValueError, "listed twice"),
        (
            {"devices": {"ps": ["a:1"], "chief": ["b:1"]}},
            ValueError,
            "no 'worker' job",
        ),
        ({"budget_seconds": 0}, ValueError, "budget_seconds: expected"),
        ({"budget_seconds": "1"}, TypeError, "budget_seconds"),
        ({"cache_dir": 3}, TypeError, "cache_dir: expected None or a folder"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, message, tmp_path):
    arguments = {
        "gradients": GRADIENTS,
        "devices": testing.cpu_devices(2),
        "budget_seconds": 1,
        "cache_dir": tmp_path,
    } | kwargs
    with pytest.raises(error, match=message):
        tf_crossdevice.autotune(
            arguments.pop("gradients"), arguments.pop("devices"), **arguments
        )


# --- Confirmation among near-equal finalists -------------------------------


def test_finalists_are_the_near_best_two_to_three_fastest_first():
    medians = {"a": 1.20, "b": 1.00, "c": 1.14, "d": 1.16, "e": 1.05}
    # Within 15% of 1.00: b, e, c (d is 16% slower); three at most.
    assert _autotune.finalists(medians) == ["b", "e", "c"]
    assert _autotune.finalists(medians, most=2) == ["b", "e"]
    assert _autotune.finalists(medians, within=0.5, most=10) == [
        "b",
        "e",
        "c",
        "d",
        "a",
    ]
    # The runner-up is always checked, however far behind.
    assert _autotune.finalists({"a": 1.0, "b": 9.0}) == ["a", "b"]
    assert _autotune.finalists({"a": 1.0}) == ["a"]
    assert _autotune.finalists({}) == []


def test_confirmation_rounds_fit_the_budget_left():
    assert _autotune.confirmation_rounds(0.2, 100.0) == 10  # at most 10
    assert _autotune.confirmation_rounds(0.2, 1.3) == 6  # floor(6.5)
    assert _autotune.confirmation_rounds(0.2, 0.6) == 3
    assert _autotune.confirmation_rounds(0.2, 0.59) == 0  # not even 3
    assert _autotune.confirmation_rounds(0.2, -5.0) == 0  # overran


class FakeTimer:
    """A timer returning fixed seconds per call; counts its calls."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.reps = []

    def __call__(self, reps):
        self.reps.append(reps)
        if self.seconds is None:
            raise RuntimeError("not a finalist: never timed again")
        return self.seconds


def test_confirmation_times_the_finalists_again_and_combines_samples():
    # First rounds: a looks fastest, b and c within 15%, d far behind.
    samples = {
        "a": [1.00, 1.01, 0.99, 1.00, 1.02],
        "b": [1.10, 1.08, 1.12, 1.09, 1.11],
        "c": [1.12, 1.13, 1.11, 1.14, 1.12],
        "d": [2.00, 2.10, 1.90, 2.00, 2.00],
    }
    first = {k: list(v) for k, v in samples.items()}
    # Confirmation: b is really the fastest, a was lucky.
    timers = {
        "a": FakeTimer(1.30),
        "b": FakeTimer(1.00),
        "c": FakeTimer(1.20),
        "d": FakeTimer(None),
    }
    reps = {"a": 2, "b": 3, "c": 1, "d": 5}
    # One finalists' round: 2 * 1.00 + 3 * 1.10 + 1 * 1.12 = 6.42 s, planned
    # with a 25% margin: 8.03 s, so 4 rounds fit in 36 s.
    final, rounds, errors = _autotune._confirm(samples, timers, reps, 36.0)
    assert final == ["a", "b", "c"] and rounds == 4 and errors == {}
    for k in final:
        assert timers[k].reps == [reps[k]] * 4
        assert samples[k] == first[k] + [timers[k].seconds] * 4
    assert timers["d"].reps == [] and samples["d"] == first["d"]
    medians = {k: np.median(first[k] + [timers[k].seconds] * 4) for k in final}
    assert medians == pytest.approx({"a": 1.02, "b": 1.08, "c": 1.14})
    # a still wins on 9 samples: 4 slow ones do not outvote 5 fast ones.
    assert _autotune.fastest(samples) == "a"
    # With the most rounds, the confirmation outvotes the first rounds.
    samples = {k: list(v) for k, v in first.items()}
    final, rounds, _ = _autotune._confirm(samples, timers, reps, 1000.0)
    assert rounds == 10
    assert np.median(samples["b"]) == pytest.approx(1.00)
    assert np.median(samples["a"]) == pytest.approx(1.30)
    assert _autotune.fastest(samples) == "b"


def test_without_budget_for_confirmation_the_first_rounds_decide():
    samples = {"a": [1.0, 1.0, 1.0], "b": [1.05, 1.04, 1.06]}
    timers = {"a": FakeTimer(None), "b": FakeTimer(None)}
    # A round of both takes 2.05 s; 3 rounds need 6.15 s.
    final, rounds, errors = _autotune._confirm(
        samples, timers, {"a": 1, "b": 1}, 6.0
    )
    assert (final, rounds, errors) == (["a", "b"], 0, {})
    assert samples == {"a": [1.0, 1.0, 1.0], "b": [1.05, 1.04, 1.06]}
    assert _autotune.fastest(samples) == "a"


def test_a_finalist_that_fails_when_confirmed_drops_out():
    samples = {"a": [1.0], "b": [1.1]}
    timers = {"a": FakeTimer(None), "b": FakeTimer(1.2)}
    final, rounds, errors = _autotune._confirm(
        samples, timers, {"a": 1, "b": 1}, 100.0
    )
    assert final == ["a", "b"] and rounds == 10
    assert list(errors) == ["a"] and "RuntimeError" in errors["a"]
    assert list(samples) == ["b"] and _autotune.fastest(samples) == "b"


class TenthSpeedClock:
    """`time` for autotune, with `monotonic()` running at a tenth of the real
    rate: a budget of 3 s on it is 30 real seconds, so a busy machine (the
    suite runs beside worker processes) cannot squeeze out the rounds these
    tests look at. Everything else is the real `time` module."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def monotonic(self) -> float:
        return self._start + (time.monotonic() - self._start) / 10

    def __getattr__(self, name):
        return getattr(time, name)


def logged_autotune_of_three(tmp_path, monkeypatch):
    """autotune on 2 CPUs trying only the first three candidates, with a
    budget (3 s on a clock at a tenth of real speed) in which all three are
    built, timed and confirmed: (the ops, its absl INFO lines, the
    devices)."""
    monkeypatch.setattr(_autotune, "time", TenthSpeedClock())
    candidates = _candidates.timed_candidates
    monkeypatch.setattr(
        _candidates, "timed_candidates", lambda t, g: candidates(t, g)[:3]
    )
    lines = []
    monkeypatch.setattr(
        absl_logging, "info", lambda msg, *args: lines.append(msg % args)
    )
    devices = testing.cpu_devices(2)
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=3, cache_dir=tmp_path
    )
    return ops, lines, devices


def test_no_budget_to_confirm_still_gives_a_verified_choice(
    tmp_path, monkeypatch
):
    """autotune logs the skipped confirmation and keeps the first rounds'
    fastest (no confirmation round fits)."""
    monkeypatch.setattr(_autotune, "confirmation_rounds", lambda *a: 0)
    ops, lines, devices = logged_autotune_of_three(tmp_path, monkeypatch)
    result = ops.autotune_result
    timed = [m for m in result.measurements if m.median_seconds is not None]
    assert len(timed) == 3 and all(m.verified for m in timed)
    assert all(m.confirmation_rounds == 0 for m in result.measurements)
    assert any("no confirmation of the" in line for line in lines)
    assert not any("finalist" in line and " ms" in line for line in lines)
    fastest = min(timed, key=lambda m: m.median_seconds)
    assert result.config == fastest.config
    batch_sums_like_numpy(ops, devices)


def test_confirmed_finalists_are_logged_and_recorded(tmp_path, monkeypatch):
    ops, lines, devices = logged_autotune_of_three(tmp_path, monkeypatch)
    result = ops.autotune_result
    confirmed = [m for m in result.measurements if m.confirmation_rounds]
    finalist_lines = [line for line in lines if "autotune: finalist" in line]
    assert len(finalist_lines) == len(confirmed)
    assert 2 <= len(confirmed) <= 3
    assert {m.confirmation_rounds for m in confirmed} <= set(range(3, 11))
    fastest = min(confirmed, key=lambda m: m.median_seconds)
    assert result.label == fastest.label
    # One line per finalist, with its median over all its samples.
    for m in confirmed:
        (line,) = [x for x in finalist_lines if f"finalist {m.label}:" in x]
        assert f" {m.median_seconds * 1e3:.2f} ms" in line
        assert f"+ {m.confirmation_rounds} confirmation rounds" in line
    # The cache keeps the new field; a second call reads it back.
    again = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=3, cache_dir=tmp_path
    )
    assert again.autotune_result.from_cache
    assert again.autotune_result.measurements == result.measurements


# --- Cache versions ---------------------------------------------------------


def test_a_cache_of_another_candidate_list_is_measured_again(
    tmp_path, monkeypatch
):
    devices = testing.cpu_devices(2)
    topology = _topology.Topology.of(devices)
    grads = _topology.normalize_gradients(GRADIENTS)
    current = _candidates.timed_candidates(topology, grads)
    old = [c for c in current if c[0] == "ReductionToOneDevice"]
    monkeypatch.setattr(_candidates, "timed_candidates", lambda t, g: list(old))
    old_path = _cache.cache_file(topology, grads, tmp_path)
    entry = {
        "format": _cache.CACHE_FORMAT,
        "config": ["ReductionToOneDevice", {}],
        "label": "ReductionToOneDevice",
        "budget_seconds": 100.0,
        "complete": True,
    }
    _cache.write_cache(old_path, entry)
    spy = PrepareSpy(monkeypatch)
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=0.5, cache_dir=tmp_path
    )
    assert spy.calls == 0 and ops.autotune_result.from_cache
    # Today's list: another file, measured again.
    monkeypatch.setattr(
        _candidates, "timed_candidates", lambda t, g: list(current)
    )
    new_path = _cache.cache_file(topology, grads, tmp_path)
    assert new_path != old_path
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=0.5, cache_dir=tmp_path
    )
    assert spy.calls >= 1 and not ops.autotune_result.from_cache
    assert ops.autotune_result.cache_file == str(new_path)
    batch_sums_like_numpy(ops, devices)


def test_cached_records_without_the_newer_fields_are_read(
    tmp_path, monkeypatch
):
    """An entry written before `confirmation_rounds` existed (and one with
    a field this version does not know) still reads."""
    devices = testing.cpu_devices(2)
    topology = _topology.Topology.of(devices)
    grads = _topology.normalize_gradients(GRADIENTS)
    record = {
        "label": "ReductionToOneDevice",
        "config": ["ReductionToOneDevice", {}],
        "predicted_seconds": None,
        "verified": True,
        "error": None,
        "build_seconds": 0.25,
        "median_seconds": 0.003,
    }
    entry = {
        "format": _cache.CACHE_FORMAT,
        "config": ["ReductionToOneDevice", {}],
        "label": "ReductionToOneDevice",
        "budget_seconds": 10.0,
        "complete": True,
        "measurements": [record, record | {"from_the_future": 1}],
    }
    path = _cache.cache_file(topology, grads, tmp_path)
    _cache.write_cache(path, entry)
    spy = PrepareSpy(monkeypatch)
    ops = tf_crossdevice.autotune(
        GRADIENTS, devices, budget_seconds=1, cache_dir=tmp_path
    )
    assert spy.calls == 0 and ops.autotune_result.from_cache
    first, second = ops.autotune_result.measurements
    assert first == second
    assert first.confirmation_rounds == 0 and first.median_seconds == 0.003
    assert first.config == ("ReductionToOneDevice", {})
