"""Gives every test process 8 logical CPU devices before TensorFlow starts.

Tests use subsets of these (1, 2, 3, 4 and 8 devices); see
tf_crossdevice.testing. Doctests get `tf`, `np` and `tf_crossdevice`;
`watched_heartbeat` makes a test's process watched by a launcher.
"""

import json
import os
import pathlib
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_crossdevice  # noqa: E402
from tf_crossdevice import testing  # noqa: E402

testing.request_cpu_devices(8)

# Legacy scripts that tests/compat/compat_corpus_test.py runs as programs;
# one is TF 1 code that cannot be imported (--doctest-modules would)
# before upgrading.
collect_ignore = ["tests/compat/corpus"]


@pytest.fixture
def watched_heartbeat(tmp_path, monkeypatch) -> pathlib.Path:
    """A heartbeat file as the launcher makes it (empty, time 0: no
    heartbeat yet), named in this process's environment: for the test, a
    launcher watches this process (tf_crossdevice.cluster.heartbeat)."""
    path = tmp_path / "beat"
    path.touch()
    os.utime(path, (0, 0))
    monkeypatch.setenv(tf_crossdevice.cluster.HEARTBEAT_VARIABLE, str(path))
    return path


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    doctest_namespace.update(tf=tf, np=np, tf_crossdevice=tf_crossdevice)


# Under `pytest -n 2 --dist loadgroup` (scripts/run_tests.sh) the tests that
# share a module-scoped setup (a cluster of worker processes, a benchmark
# run) go to one xdist worker, so that it starts once, and every other test
# is scheduled on its own, so that neither worker idles while the other has
# tests queued. The largest groups start first. xdist's own loadgroup reads
# xdist_group marks by renaming node ids, which pytest 9 ignores; here each
# xdist worker writes the groups it collected to GROUPS_DIR (a folder the
# controller makes) and the controller's scheduler reads them.
GROUPS_DIR = "TF_CROSSDEVICE_XDIST_GROUPS"


def pytest_configure(config: pytest.Config) -> None:
    if (
        not hasattr(config, "workerinput")
        and config.getoption("dist", None) == "loadgroup"
    ):
        os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="xdist_groups_")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and GROUPS_DIR in os.environ:
        shutil.rmtree(os.environ.pop(GROUPS_DIR), ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    workerinput = getattr(config, "workerinput", None)
    folder = os.environ.get(GROUPS_DIR)
    if workerinput is None or not folder:
        return
    groups = shared_setup_groups(items)
    path = pathlib.Path(folder, f"{workerinput['workerid']}.json")
    path.write_text(
        json.dumps(
            {i.nodeid: g for i, g in zip(items, groups, strict=True) if g}
        )
    )


@pytest.hookimpl(optionalhook=True)  # xdist's hook: xdist may be absent
def pytest_xdist_make_scheduler(config, log):
    if GROUPS_DIR not in os.environ:
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class SharedSetupScheduling(LoadScopeScheduling):
        """Work units: each group of tests sharing a setup, each other test."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # Workers wrote them before reporting.
                self.groups = {}
                for path in pathlib.Path(os.environ[GROUPS_DIR]).glob("*.json"):
                    self.groups.update(json.loads(path.read_text()))
            group = self.groups.get(nodeid)
            return f"group {group}" if group else nodeid

    return SharedSetupScheduling(config, log)


def shared_setups(item: pytest.Item) -> list[str]:
    """The item's module/class/session-scoped fixtures of this repository,
    each with the parameter it runs with (module:fixture[index])."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # an item with no fixtures
        return []
    callspec = getattr(item, "callspec", None)
    indices = callspec.indices if callspec else {}
    names = []
    for name in info.names_closure:
        fixturedefs = info.name2fixturedefs.get(name)
        # baseid "": pytest's and plugins' fixtures (tmp_path_factory, ...).
        if (
            fixturedefs
            and fixturedefs[-1].baseid
            and fixturedefs[-1].scope != "function"
        ):
            names.append(name)
    # A fixture that uses a parametrized one has an instance per parameter.
    params = "".join(f"[{indices[n]}]" for n in names if n in indices)
    return [f"{item.path.name}:{name}{params}" for name in names]


def shared_setup_groups(items: list[pytest.Item]) -> list[str | None]:
    """Per item, the name of its group (None when it shares no setup):
    items are in one group when they share a setup, directly or not."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    per_item = [shared_setups(item) for item in items]
    for keys in per_item:
        for key in keys[1:]:
            a, b = sorted((root(keys[0]), root(key)))
            parent[b] = a
    return [root(keys[0]) if keys else None for keys in per_item]
