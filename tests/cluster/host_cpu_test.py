"""Each emulated host's CPU time: what every process on it used, no more.

A process on host 0 burns BURN seconds of CPU itself and as much again in
a child it starts and waits for (a process that exits before the reading
must still count), then prints the CPU time that it and its child used
(`os.times`). Host 0's `cpu_seconds()` must have grown by at least that
and by at most that plus what starting the command costs (`sh`, `ip netns
exec`, Python's start); the idle host's must not have grown at all beyond
that start-up allowance. The accounting cgroups go with the hosts: after
the block, after an error in it, and after their builder was killed
(`remove_stale`).

These tests build namespaces, links and cgroups: they need root on Linux,
which README's test command and CI have.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tf_crossdevice.cluster import hosts as hosts_lib
from tf_crossdevice.cluster import processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
BURN = 0.4  # CPU seconds, in the process and again in its child.
# CPU that starting a command on a host may add (sh, ip, Python's start
# and imports), on a loaded machine.
START_UP = 0.6

BURNER = """
import os, subprocess, sys, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
burn(float(sys.argv[1]))
if len(sys.argv) > 2:  # Then the child, which exits before we answer.
    subprocess.run([sys.executable, "-c", sys.argv[2], sys.argv[1]], check=True)
t = os.times()
print(t.user + t.system + t.children_user + t.children_system, flush=True)
"""


def run_on(bed: hosts_lib.EmulatedHosts, index: int) -> float:
    """CPU seconds the burner and its child used, as they report it."""
    argv = [sys.executable, "-c", BURNER, str(BURN), BURNER]
    out = subprocess.run(
        bed.command(index, argv),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(out.stdout.split()[-1])  # The child printed its own first.


def accounting_folders(bed: hosts_lib.EmulatedHosts) -> list[pathlib.Path]:
    folders = [h.accounting for h in bed.hosts]
    assert all(f is not None for f in folders), folders
    return [f for f in folders if f is not None]


@pytest.mark.parametrize("cpu_share", [True, False], ids=["shared", "unshared"])
def test_a_host_counts_every_process_on_it_and_only_those(cpu_share):
    with hosts_lib.EmulatedHosts(2, "100mbit", cpu_share=cpu_share) as bed:
        before = bed.cpu_seconds()
        used = run_on(bed, 0)
        after = bed.cpu_seconds()
        folders = accounting_folders(bed)
        assert all(f.is_dir() for f in folders)
    grown = [a - b for a, b in zip(after, before, strict=True)]
    print(f"burner reported {used:.3f} s; hosts grew by {grown}")
    assert used >= 2 * BURN
    assert used <= grown[0] <= used + START_UP, (used, grown)
    assert 0 <= grown[1] < 0.05, grown  # Idle: nothing ran there.
    assert not any(f.exists() for f in folders)
    assert hosts_lib.leftovers(os.getpid()) == []


def test_cpu_seconds_only_grow_and_start_near_zero():
    with hosts_lib.EmulatedHosts(1, "100mbit") as bed:
        (first,) = bed.cpu_seconds()
        assert 0 <= first < 0.05  # Nothing has run there yet.
        run_on(bed, 0)
        (second,) = bed.cpu_seconds()
        assert second == pytest.approx(bed.hosts[0].cpu_seconds(), abs=0.05)
    assert second > first + 2 * BURN


def test_accounting_cgroups_are_removed_when_the_block_fails():
    with (  # noqa: PT012
        pytest.raises(ZeroDivisionError),
        hosts_lib.EmulatedHosts(2, "100mbit") as bed,
    ):
        folders = accounting_folders(bed)
        sleeper = processes.Child(bed.command(1, ["sleep", "600"]))
        procs = folders[1] / "cgroup.procs"
        deadline = time.monotonic() + 30
        while str(sleeper.process.pid) not in procs.read_text().split():
            assert time.monotonic() < deadline, "never joined"
            time.sleep(0.05)
        1 / 0  # noqa: B018
    assert sleeper.process.wait(timeout=10) == -9  # Killed.
    assert not any(f.exists() for f in folders)
    assert hosts_lib.leftovers(os.getpid()) == []


def test_a_killed_builders_accounting_cgroups_are_removed_as_stale():
    script = (
        "import time\n"
        "from tf_crossdevice.cluster import hosts\n"
        "with hosts.EmulatedHosts(2, '100mbit') as bed:\n"
        "    for h in bed.hosts:\n"
        "        print(h.accounting, flush=True)\n"
        "    time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        folders = [pathlib.Path(child.stdout.readline().strip())]
        folders.append(pathlib.Path(child.stdout.readline().strip()))
        assert all(f.is_dir() for f in folders), folders
        # Each host's cgroups are one entry: both hierarchies' folders.
        cgroups = [
            e for e in hosts_lib.leftovers(child.pid) if e.startswith("cgroup")
        ]
        assert len(cgroups) == 2, cgroups
        for entry, folder in zip(cgroups, folders, strict=True):
            assert str(folder) in entry, (entry, folder)
        child.send_signal(signal.SIGKILL)  # No chance to clean up.
        child.wait(timeout=30)
        assert all(f.is_dir() for f in folders)
        removed = hosts_lib.remove_stale()
    finally:
        child.kill()
        child.wait()
        hosts_lib.remove_stale()
    assert len([n for n in removed if "br" not in n]) == 2, removed
    assert not any(f.exists() for f in folders)
    assert hosts_lib.leftovers(child.pid) == []


def _burn_here(seconds: float) -> float:
    """Burns `seconds` of this process's CPU; returns what it used."""
    start = time.process_time()
    while time.process_time() < start + seconds:
        pass
    return time.process_time() - start


def test_charged_counts_this_process_against_the_host_until_it_leaves():
    with hosts_lib.EmulatedHosts(2, "1gbit") as bed:
        before = bed.cpu_seconds()
        with bed.charged(1):
            used = _burn_here(BURN)
        during = bed.cpu_seconds()
        _burn_here(BURN)  # Back at the root: counted on no host.
        after = bed.cpu_seconds()
    # Host 1 counted at least what this process used inside, host 0 none
    # of it; after the block neither counts this process.
    assert during[1] - before[1] >= used * 0.95
    assert during[0] - before[0] < 0.1
    assert after[1] - during[1] < 0.1
    # The hosts' cgroups were removed with this process back at the root.
    assert not hosts_lib.leftovers(os.getpid())
