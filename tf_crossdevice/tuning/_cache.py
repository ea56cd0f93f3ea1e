"""autotune's cache: one JSON file per topology, gradient set and candidate
list, holding the configuration chosen and what was measured.

A file is named by a hash of everything that would change the choice
(`cache_file`), so a stale choice is never read back, only left behind.
Reading tolerates damage (a warning, then autotune measures again);
writing is atomic, so concurrent processes never see half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Any

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import requirements
from tf_crossdevice.tuning import _candidates
from tf_crossdevice.tuning import measure as _measure
from tf_crossdevice.tuning._configs import from_json, make_ops
from tf_crossdevice.tuning._results import (
    AutotuneResult,
    candidate_result_from_json,
)
from tf_crossdevice.tuning._topology import GradientList, Topology

# Bumped when an entry's fields change meaning: older files are ignored.
CACHE_FORMAT = 1


def default_cache_dir() -> pathlib.Path:
    """`$XDG_CACHE_HOME` (else ~/.cache) / tf_crossdevice / autotune."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return pathlib.Path(base) / "tf_crossdevice" / "autotune"


def cache_file(
    topology: Topology, gradients: GradientList, cache_dir: Any = None
) -> pathlib.Path:
    """The cache file of a topology and gradient set.

    The name hashes the device type, the devices per worker, the number of
    workers, TensorFlow's and this package's versions, the gradients'
    shapes and dtypes in order (not the device names or addresses) and the
    candidate list (`candidates_digest`), so a choice made among other
    candidates is measured again.
    """
    key = {
        "candidates": candidates_digest(topology, gradients),
        "format": CACHE_FORMAT,
        "device_type": topology.device_type,
        "devices_per_worker": list(topology.devices_per_worker),
        "num_workers": topology.num_workers,
        "tensorflow": tf.__version__,
        "tf_crossdevice": requirements.__version__,
        "gradients": [[list(s), d] for s, d in gradients],
    }
    digest = hashlib.sha256(
        json.dumps(key, sort_keys=True).encode()
    ).hexdigest()
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(
            f"cache_dir: expected None or a folder path, got "
            f"{type(cache_dir).__name__} {cache_dir!r}"
        )
    folder = default_cache_dir() if cache_dir is None else cache_dir
    return pathlib.Path(folder) / f"{digest[:32]}.json"


def candidates_digest(topology: Topology, gradients: GradientList) -> str:
    """A hash of `timed_candidates` for a topology and gradient set, in
    order: it changes whenever the candidate list does.

    >>> topology = Topology.of(["/job:localhost/replica:0/task:0/device:CPU:0"])
    >>> len(candidates_digest(topology, [((4,), "float32")]))
    16
    """
    configs = json.dumps(
        _candidates.timed_candidates(topology, gradients), sort_keys=True
    )
    return hashlib.sha256(configs.encode()).hexdigest()[:16]


def read_cache(path: pathlib.Path, topology: Topology) -> dict[str, Any] | None:
    """The cached entry, or None (missing; corrupt: with a warning)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        logging.warning("autotune: cannot read cache file %s (%s)", path, e)
        return None
    try:
        entry = json.loads(text)
        if entry.get("format") != CACHE_FORMAT:
            logging.warning(
                "autotune: ignoring cache file %s of format %r (this "
                "version reads %d); measuring again",
                path,
                entry.get("format"),
                CACHE_FORMAT,
            )
            return None
        config = from_json(entry["config"])
        make_ops(config, topology)
        float(entry["budget_seconds"])
        bool(entry["complete"])
        measurements = [
            candidate_result_from_json(m) for m in entry.get("measurements", [])
        ]
    except Exception as e:  # noqa: BLE001 - any damage: ignore the file.
        logging.warning(
            "autotune: ignoring corrupt cache file %s (%s: %s); measuring "
            "again",
            path,
            type(e).__name__,
            _measure.first_line(str(e)),
        )
        return None
    entry["config"] = config
    entry["measurements"] = measurements
    return entry


def cached_result(
    entry: dict[str, Any], path: pathlib.Path, elapsed_seconds: float
) -> AutotuneResult:
    """autotune's answer from a cache entry (`read_cache`), logged once
    with the file, at WARNING: absl shows nothing below it by default, and
    an answer measured in another run (another load, another version of
    the model) is one a user must be able to see, not only notice by how
    fast it returned."""
    logging.warning(
        "autotune: %s, read from the cache file %s (measured %s with a "
        "%g s budget); nothing measured now: delete the file to measure "
        "again",
        entry["label"],
        path,
        entry.get("measured_at", "earlier"),
        entry["budget_seconds"],
    )
    return AutotuneResult(
        config=entry["config"],
        label=entry["label"],
        measurements=tuple(entry["measurements"]),
        budget_seconds=entry["budget_seconds"],
        elapsed_seconds=elapsed_seconds,
        complete=entry["complete"],
        from_cache=True,
        cache_file=str(path),
    )


def write_cache(path: pathlib.Path, entry: dict[str, Any]) -> None:
    """Writes `entry` as JSON atomically (a temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
