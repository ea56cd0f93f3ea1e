"""Emulated hosts: several machines on this one, joined by shaped links.

Between real machines the wire bounds an all-reduce; between processes on
one machine over loopback the cores do, so loopback cannot show what an
algorithm or wire compression gains between hosts. `EmulatedHosts` builds
what a small cluster looks like to the processes in it:

- each host is a Linux network namespace with one interface, `eth0`, and
  its own address in 198.18.k.0/24 (198.18.0.0/15 is reserved for network
  benchmarks; each set of hosts takes a free k);
- the hosts' links meet on a bridge in this (the root) namespace, which
  also holds the address 198.18.k.254, so that a client here (an in-graph
  job's) reaches every host;
- each link is shaped to `link_rate` in both directions with a token
  bucket (`tc ... tbf`): the host's end limits what it sends, the bridge's
  end what it receives. Latency cannot be added (this kernel has no
  `netem`); links use jumbo frames (`mtu`), as clusters' networks do;
- each host's processes share an equal part of this machine's cores (a
  CPU cgroup), so that adding hosts neither speeds up nor slows down the
  compute of each;
- each host's processes are counted together (a cgroup of the `cpuacct`
  controller, the same folder where it shares the `cpu` controller's
  hierarchy): `cpu_seconds()` is the CPU time each host has used, what
  its all-reduces cost in copies, codec passes and gRPC.

Everything is made on entering a `with` block and removed on leaving it,
also after an error, and after a SIGTERM where nothing else handles it
(it ends the block as `SystemExit`); what a killed process left behind
(its names carry its process id) is removed by the next one that builds
hosts. Needs root on Linux, with `ip` and `tc`.

    with EmulatedHosts(2, link_rate="1gbit") as hosts:
        child = processes.Child(hosts.command(0, [sys.executable, "w.py"]))
        ...
        sent, received = hosts.link_bytes()[0]
        busy = hosts.cpu_seconds()  # Each host's CPU time so far.
        hosts.cut(1)  # Host 1 is off the network...
        hosts.restore(1)  # ...and back.
        hosts.throttle(1, "100kbit")  # Its link crawls...
        hosts.restore(1)  # ...and is back at link_rate.
        answering(hosts)  # The hosts that reach this namespace: [0, 1].

On the command line, the launcher runs a job's workers one per emulated
host and removes the hosts after:

    python -m tf_crossdevice.launch --num_workers=4 --emulate_hosts \\
        --link_rate=1gbit -- python examples/train.py --job_name=worker
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pathlib
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psutil

from tf_crossdevice._core import checks
from tf_crossdevice.cluster import _commands
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.cluster._answering import answering

__all__ = [
    "EmulatedHosts",
    "answering",
    "Host",
    "LinkBytes",
    "check_supported",
    "leftovers",
    "parse_rate",
    "remove_stale",
]

_PREFIX = "tfx"
_CGROUP_CPU = pathlib.Path("/sys/fs/cgroup/cpu")
_CGROUP_CPUACCT = pathlib.Path("/sys/fs/cgroup/cpuacct")
_USAGE = "cpuacct.usage"  # Nanoseconds of CPU, every task of the cgroup.
_PERIOD_US = 100_000
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_rate(rate: str, argument: str = "link_rate") -> float:
    """Bits per second of a rate written as `tc` reads it.

    >>> parse_rate("1gbit"), parse_rate("250mbit"), parse_rate("10mbps")
    (1000000000.0, 250000000.0, 80000000.0)
    """
    match = _RATE.fullmatch(rate.strip()) if isinstance(rate, str) else None
    value = 0.0
    if match is not None:
        value = float(match[1]) * _UNITS[match[2].lower()]
        value *= 8 if match[3].lower() == "bps" else 1
    if value <= 0:
        raise ValueError(
            f"{argument}: expected a positive rate such as '1gbit', "
            f"'250mbit' or '100mbps', got {rate!r}"
        )
    return value


@dataclasses.dataclass(frozen=True)
class Host:
    """One emulated host.

    Attributes:
        index: its position, from 0.
        namespace: its network namespace (`ip netns exec NAMESPACE ...`).
        address: its IPv4 address, as other hosts and the client dial it.
        link: the bridge's end of its link, in the root namespace.
        cgroup: its CPU cgroup's folder, or None without a CPU share.
        accounting: its CPU accounting cgroup's folder (`cpuacct`; the
            same as `cgroup` where both controllers share a hierarchy), or
            None where this machine mounts no `cpuacct` hierarchy.
    """

    index: int
    namespace: str
    address: str
    link: str
    cgroup: pathlib.Path | None
    accounting: pathlib.Path | None = None

    def cpu_seconds(self) -> float:
        """CPU seconds (user and system) that the host's processes have
        used since it was built, those that exited included.

        Raises:
            RuntimeError: the host has no accounting cgroup.
        """
        if self.accounting is None:
            raise RuntimeError(
                f"host {self.index}: no CPU accounting; this machine mounts "
                f"no cgroup v1 'cpuacct' hierarchy (looked for "
                f"{_CGROUP_CPU / _USAGE} and {_CGROUP_CPUACCT / _USAGE})"
            )
        return int((self.accounting / _USAGE).read_text()) / 1e9


@dataclasses.dataclass(frozen=True)
class LinkBytes:
    """Bytes one host has sent and received on its link (headers
    included), counted since the hosts were built."""

    sent: int
    received: int


class EmulatedHosts:
    """`num_hosts` emulated hosts on shaped links (see the module docstring).

    Args:
        num_hosts: how many, 1 to 253.
        link_rate: each link's rate, each way, as `tc` writes it ('1gbit').
        cpu_share: give each host's processes an equal share of the cores.
            Their CPU time is counted either way (`cpu_seconds`).
        mtu: the links' MTU in bytes.

    Raises:
        ValueError: an argument has a bad type or value.
        RuntimeError: not root on Linux, or `ip`/`tc` missing, or the kernel
            refused a step (the message names the command); everything made
            up to then is removed first.
    """

    def __init__(
        self,
        num_hosts: int,
        link_rate: str = "1gbit",
        *,
        cpu_share: bool = True,
        mtu: int = 9000,
    ) -> None:
        checks.positive_int(num_hosts, "num_hosts")
        if num_hosts > 253:
            raise ValueError(
                f"num_hosts: at most 253 (one /24 network), got {num_hosts}"
            )
        parse_rate(link_rate)  # Checked here, before anything is built.
        self.link_rate = link_rate
        self.num_hosts = num_hosts
        self.cpu_share = bool(cpu_share)
        checks.positive_int(mtu, "mtu")
        self.mtu = mtu
        self.hosts: list[Host] = []
        self.client_address = ""
        self._tag = f"{_PREFIX}{os.getpid()}"
        self._bridge = ""
        self._numbers: list[int] = []
        self._baseline: list[tuple[int, int]] = []
        self._sigterm_installed = False

    def __enter__(self) -> EmulatedHosts:
        check_supported()
        with _commands.lock():
            remove_stale()
            subnet = _commands.free_subnet()
            # Names free among this process's other live hosts, so that
            # several sets of hosts can coexist in one process.
            made = {name for _, name in _made(self._tag)}
            self._bridge = next(
                name
                for k in itertools.count()
                if (name := f"{self._tag}br{k or ''}") not in made
            )
            self._numbers = list(
                itertools.islice(
                    (
                        n
                        for n in itertools.count()
                        if f"{self._tag}h{n}" not in made
                    ),
                    self.num_hosts,
                )
            )
            try:
                self._build(subnet)
            except BaseException:
                self.close()
                raise
        self._baseline = [self._counters(h) for h in self.hosts]
        self._handle_sigterm()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _handle_sigterm(self) -> None:
        """Makes a SIGTERM raise `SystemExit` while the hosts are up, so
        that the `with` block unwinds and removes them: by default the
        signal ends the process at once, leaving them until the next
        build. Only where the default holds (a launcher or a test runner
        may have its own) and in the main thread (the only one Python
        runs handlers in)."""
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
            self._sigterm_installed = True

    def _build(self, subnet: int) -> None:
        net = f"198.18.{subnet}"
        self.client_address = f"{net}.254"
        _commands.ip("link", "add", self._bridge, "type", "bridge")
        _commands.ip("link", "set", self._bridge, "mtu", str(self.mtu))
        _commands.ip(
            "addr", "add", f"{self.client_address}/24", "dev", self._bridge
        )
        _commands.ip("link", "set", self._bridge, "up")
        cores = os.cpu_count() or 1
        counted = _accounting_root()
        for i in range(self.num_hosts):
            number = self._numbers[i]
            ns, link = f"{self._tag}h{number}", f"{self._tag}h{number}b"
            cgroup = _CGROUP_CPU / ns if self.cpu_share else None
            accounting = counted / ns if counted is not None else None
            # Listed first, so that close() removes what half-built.
            self.hosts.append(
                Host(i, ns, f"{net}.{i + 1}", link, cgroup, accounting)
            )
            _commands.ip("netns", "add", ns)
            _commands.ip("link", "add", link, "type", "veth", "peer", "name",
                f"{ns}n", "netns", ns)  # fmt: skip
            _commands.ip("-n", ns, "link", "set", f"{ns}n", "name", "eth0")
            for where, dev in ((["-n", ns], "eth0"), ([], link)):
                _commands.ip(*where, "link", "set", dev, "mtu", str(self.mtu))
                _commands.ip(*where, "link", "set", dev, "up")
                _commands.tbf("add", where, dev, self.link_rate,
                              _commands.FULL_BURST_BYTES)  # fmt: skip
            _commands.ip("link", "set", link, "master", self._bridge)
            _commands.ip(
                "-n", ns, "addr", "add", f"{net}.{i + 1}/24", "dev", "eth0"
            )
            _commands.ip("-n", ns, "link", "set", "lo", "up")
            if cgroup is not None:
                cgroup.mkdir()
                quota = int(cores * _PERIOD_US / self.num_hosts)
                (cgroup / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
                (cgroup / "cpu.cfs_quota_us").write_text(str(quota))
            if accounting is not None:
                accounting.mkdir(exist_ok=accounting == cgroup)

    @contextlib.contextmanager
    def charged(self, index: int) -> Iterator[None]:
        """Counts this process against host `index`'s CPU share and
        accounting while inside, in the namespace it is in: a process on
        the bridge, such as an in-graph controller, then gets no CPU beyond
        the hosts' shares, as if it ran on that host."""
        folders = _cgroups(self._host(index))
        for folder in folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:  # Back to the root, so that the host's cgroups can go.
            for folder in folders:
                (folder.parent / "cgroup.procs").write_text(str(os.getpid()))

    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """`argv` as a command that runs on host `index` (in its network
        namespace and CPU share), for `processes.Child` or subprocess."""
        host = self.hosts[index]
        argv = checks.string_list(argv, "argv", "command-line word")
        enter = ["ip", "netns", "exec", host.namespace, *argv]
        folders = _cgroups(host)
        if not folders:
            return enter
        # Joined before entering the namespace: `ip netns exec` mounts the
        # namespace's own /sys, which has no cgroup folders. Every process
        # the command starts stays in them.
        join = " && ".join(f'echo $$ > "{f}/cgroup.procs"' for f in folders)
        return ["sh", "-c", f'{join} && exec "$@"', "sh", *enter]

    def cut(self, index: int) -> None:
        """Cuts host `index` off the network until `restore(index)`.

        Sets the bridge's end of its link down: the bridge stops
        forwarding to and from that port, and the host's own end loses its
        carrier, so nothing crosses in either direction (the tests check
        both). Nothing is closed or reset: open connections see silence,
        not an error, and TCP retransmits, as when a cable is pulled or a
        switch port fails. Processes on the host keep running. Cutting a
        cut host does nothing.

        Raises:
            ValueError: `index` is not a host's index.
            RuntimeError: `ip` failed (the message names the command).
        """
        _commands.ip("link", "set", self._host(index).link, "down")

    def throttle(self, index: int, rate: str) -> None:
        """Shapes host `index`'s link to `rate`, both ways, until
        `restore(index)`: a link slowed to a crawl (a failing cable or
        switch port, a saturated uplink) rather than cut.

        Both ends' token buckets change in place (`tc qdisc change`), so
        open connections stay open and packets keep flowing, at `rate`.
        The bucket shrinks with the rate (to a tenth of a second's bytes,
        and at least one frame, the least that lets a frame through), so
        that nothing crosses at the old rate first.

        Raises:
            ValueError: `index` is not a host's index, or `rate` not a rate.
            RuntimeError: `tc` failed (the message names the command).
        """
        host = self._host(index)
        bits = parse_rate(rate, "rate")
        self._shape(host, rate, _commands.burst_bytes(bits, self.mtu))

    def restore(self, index: int) -> None:
        """Undoes `cut(index)` and `throttle(index, ...)`: host `index` is
        connected again at `link_rate`; its address is unchanged.
        Connections still open carry on once TCP retransmits (within a few
        seconds of a short cut). Restoring a connected host at full rate
        does nothing.

        Raises:
            ValueError: `index` is not a host's index.
            RuntimeError: `ip` or `tc` failed (the message names the
                command).
        """
        host = self._host(index)
        self._shape(host, self.link_rate, _commands.FULL_BURST_BYTES)
        _commands.ip("link", "set", host.link, "up")

    @staticmethod
    def _shape(host: Host, rate: str, burst: int) -> None:
        for where, dev in ((["-n", host.namespace], "eth0"), ([], host.link)):
            _commands.tbf("change", where, dev, rate, burst)

    def _host(self, index: int) -> Host:
        return self.hosts[
            checks.index(index, "index", len(self.hosts), "a host")
        ]

    def cpu_seconds(self) -> list[float]:
        """Per host: CPU seconds its processes have used since it was
        built (`Host.cpu_seconds`).

        Raises:
            RuntimeError: this machine has no CPU accounting.
        """
        return [host.cpu_seconds() for host in self.hosts]

    def link_bytes(self) -> list[LinkBytes]:
        """Per host: bytes sent and received since the hosts were built."""
        out = []
        for host, (rx0, tx0) in zip(self.hosts, self._baseline, strict=True):
            rx, tx = self._counters(host)
            # The bridge's end receives what the host sends.
            out.append(LinkBytes(sent=rx - rx0, received=tx - tx0))
        return out

    @staticmethod
    def _counters(host: Host) -> tuple[int, int]:
        stats = pathlib.Path("/sys/class/net", host.link, "statistics")
        return (
            int((stats / "rx_bytes").read_text()),
            int((stats / "tx_bytes").read_text()),
        )

    def close(self) -> None:
        """Stops every process on the hosts and removes all that was made.
        Safe to call twice."""
        for host in self.hosts:
            _remove_host(host.namespace, host.link, _cgroups(host))
        if self._bridge:
            _commands.ip("link", "del", self._bridge, check=False)
        self.hosts = []
        self._bridge = ""
        if self._sigterm_installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._sigterm_installed = False

    def __repr__(self) -> str:
        return (
            f"EmulatedHosts({self.num_hosts}, link_rate={self.link_rate!r}, "
            f"cpu_share={self.cpu_share}, mtu={self.mtu})"
        )


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def check_supported() -> None:
    """Raises RuntimeError saying what is missing to emulate hosts here."""
    missing = []
    if not sys.platform.startswith("linux"):
        missing.append(f"Linux (this is {sys.platform})")
    elif os.geteuid() != 0:
        missing.append("root (network namespaces and tc need it)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(
                f"the '{tool}' command (Debian: apt install iproute2)"
            )
    if missing:
        raise RuntimeError(
            "emulated hosts need " + ", ".join(missing) + "; run on a real "
            "cluster instead, or on a Linux machine as root"
        )


def remove_stale() -> list[str]:
    """Removes hosts, bridges and cgroups whose building process is gone;
    returns their names."""
    removed = []
    for name in sorted({name for _, name in _made(rf"{_PREFIX}\d+")}):
        match = re.match(rf"{_PREFIX}(\d+)", name)
        if match is None or psutil.pid_exists(int(match[1])):
            continue
        if re.fullmatch(rf"{_PREFIX}\d+br\d*", name):
            _commands.ip("link", "del", name, check=False)
        elif re.fullmatch(rf"{_PREFIX}\d+h\d+", name):
            _remove_host(name, f"{name}b", [r / name for r in _cgroup_roots()])
        else:
            continue
        removed.append(name)
    return removed


def leftovers(pid: int | None = None) -> list[str]:
    """What emulated hosts made by process `pid` (default: any) still
    exists: 'netns NAME', 'link NAME' and 'cgroup PATHS' entries (one per
    host's cgroup: its folders in the CPU and accounting hierarchies that
    still hold it, comma-separated)."""
    tag = f"{_PREFIX}{pid}" if pid is not None else rf"{_PREFIX}\d+"
    made = _made(tag)
    folders = [
        ", ".join(str(r / name) for r in _cgroup_roots() if (r / name).is_dir())
        for name in sorted({name for kind, name in made if kind == "cgroup"})
    ]
    return sorted(
        [f"{kind} {name}" for kind, name in made if kind != "cgroup"]
        + [f"cgroup {f}" for f in folders if f]
    )


def _accounting_root() -> pathlib.Path | None:
    """The cgroup v1 hierarchy that counts CPU time (`cpuacct`): the CPU
    controller's where both share one, else its own, else None."""
    for root in (_CGROUP_CPU, _CGROUP_CPUACCT):
        if (root / _USAGE).is_file():
            return root
    return None


def _cgroup_roots() -> list[pathlib.Path]:
    """The hierarchies hosts make cgroups in: the CPU controller's and
    the accounting one (once where they are the same)."""
    counted = _accounting_root()
    roots = [_CGROUP_CPU] + ([counted] if counted is not None else [])
    return list({r.resolve(): r for r in roots if r.is_dir()}.values())


def _cgroups(host: Host) -> list[pathlib.Path]:
    """The cgroup folders a host's processes join (each once)."""
    return list(dict.fromkeys(f for f in (host.cgroup, host.accounting) if f))


def _made(tag: str) -> list[tuple[str, str]]:
    """(kind, name) of each namespace, link and cgroup here whose name
    starts with the regular expression `tag` (a builder's prefix); a cgroup
    in both hierarchies is listed once."""
    mine = re.compile(rf"{tag}\D")
    found = [
        ("netns", n)
        for n in _commands.run(["ip", "netns", "list"], check=False).split()
        if mine.match(n)
    ]
    links = _commands.run(["ip", "-o", "link", "show"], check=False)
    found += [
        ("link", n) for n in re.findall(rf"\d+: ({tag}\D[a-z0-9]*)[@:]", links)
    ]
    cgroups = {
        p.name
        for root in _cgroup_roots()
        for p in root.glob(f"{_PREFIX}*")
        if p.is_dir() and mine.match(p.name)
    }
    return found + [("cgroup", name) for name in sorted(cgroups)]


def _remove_host(
    namespace: str, link: str, cgroups: Sequence[pathlib.Path]
) -> None:
    # Processes first: a namespace lives on while a process is in it.
    pids = _commands.run(
        ["ip", "netns", "pids", namespace], check=False
    ).split()
    for cgroup in cgroups:
        if cgroup.is_dir():
            pids += (cgroup / "cgroup.procs").read_text().split()
    # And those still on their way in (`command`'s wrapper names the host).
    for process in psutil.process_iter(["cmdline"]):
        if namespace in (process.info["cmdline"] or ()) or any(
            f"/{namespace}/" in word for word in process.info["cmdline"] or ()
        ):
            pids.append(str(process.pid))
    killed = [p for p in map(_process, set(pids)) if p is not None]
    for process in killed:
        with contextlib.suppress(psutil.Error):
            process.kill()
    _wait_gone(killed, timeout=10)
    _commands.ip(
        "netns", "del", namespace, check=False
    )  # Deletes its link too.
    _commands.ip("link", "del", link, check=False)
    for cgroup in cgroups:
        for _ in range(50):
            if not cgroup.is_dir():
                break
            try:
                cgroup.rmdir()
            except OSError:
                time.sleep(0.1)


def _process(pid: str) -> psutil.Process | None:
    try:
        return psutil.Process(int(pid))
    except psutil.Error:
        return None


def _wait_gone(processes: list[psutil.Process], timeout: float) -> None:
    """Waits until each process has exited, without reaping it (a child's
    parent, maybe a `subprocess.Popen`, reads its status)."""
    deadline = time.monotonic() + timeout
    for process in processes:
        while time.monotonic() < deadline and _processes._is_alive(process):
            time.sleep(0.02)
