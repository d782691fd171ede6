"""Separate "hosts" on one machine for tests: Linux network namespaces joined by veth links.

A :class:`Lab` creates namespaces (each with its own loopback, no default route), veth pairs
between them (or to the root namespace) with a ``/30`` each out of one ``/24`` it picked unused
in ``10.254.0.0/16``, extra addresses and host routes -- and removes all of it on ``close`` (also
when the test failed: use it as a context manager or a fixture finalizer).  Nothing is routed
beyond the links the lab made: a namespace reaches only its own loopback and its link peers.

:class:`Namespace` runs commands inside one (``ip netns exec``), optionally with some directories
*hidden* behind an empty read-only tmpfs in that command's private mount namespace, so a "host"
cannot even see another's files; and runs Python code of this process there (a thread that
``setns(2)``-ed itself in: sockets it opens belong to the namespace, the rest of the process
stays where it was).

Needs: root (``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN``), iproute2's ``ip`` (``apt-get install
iproute2``), a kernel with veth (and ``mount -t tmpfs`` for hidden directories).
:func:`unavailable` says why not, for a ``pytest.skip``.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
#: one file per live lab, ``<tag>`` holding its owner's pid and start time (see :func:`sweep_stale`)
OWNERS_DIR = Path("/run/airflow-cdc-netns")
#: hide directories, then exec the rest: ``sh -c SCRIPT name DIR... -- argv...``
_HIDE_SCRIPT = (
    'while [ "$1" != -- ]; do mount -t tmpfs -o ro,size=16k,mode=0555 cdc-hidden "$1" || exit 125; '
    'shift; done; shift; exec "$@"'
)


class NetnsError(RuntimeError):
    """An ``ip`` command failed (its stderr is in the message)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS...``.

    :raises NetnsError: with its output when it fails and ``check`` is set.
    """
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """Why this machine cannot run a :class:`Lab` (``None`` when it can): not root, no ``ip``, or
    creating a namespace with a veth link fails (an unprivileged container).  Probes by creating
    and deleting one namespace."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is missing (apt-get install iproute2)"
    try:
        with Lab() as lab:
            lab.link(None, lab.namespace("probe"))
    except (NetnsError, OSError) as e:
        return f"cannot create network namespaces / veth links here: {e}"
    return None


class Namespace:
    """One named network namespace (made by :meth:`Lab.namespace`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def prefix(self, hide: Sequence[str | os.PathLike[str]] = ()) -> list[str]:
        """The argv to put before a command to run it here (``ip netns exec NAME``).

        :param hide: existing directories the command and its children see as empty and
            read-only (a tmpfs over each, in the command's own mount namespace: ``ip netns
            exec`` makes one, and mounts there never propagate back).
        """
        out = ["ip", "netns", "exec", self.name]
        if hide:
            out += ["sh", "-c", _HIDE_SCRIPT, "cdc-netns", *(str(Path(d).resolve()) for d in hide), "--"]
        return out

    def popen(
        self, argv: Sequence[str], *, hide: Sequence[str | os.PathLike[str]] = (), **kwargs: Any
    ) -> Any:
        """``subprocess.Popen`` of ``argv`` in this namespace (in a new session unless told)."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen([*self.prefix(hide), *argv], **kwargs)

    def run(
        self, argv: Sequence[str], *, hide: Sequence[str | os.PathLike[str]] = (), **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` of ``argv`` in this namespace (``capture_output``/``text`` default on)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run([*self.prefix(hide), *argv], **kwargs)

    def enter_thread(self) -> None:
        """Move the calling thread (never the main thread) into this namespace for good.

        :raises RuntimeError: on the main thread (the whole test would move).
        :raises OSError: when ``setns`` fails.
        """
        if threading.current_thread() is threading.main_thread():
            raise RuntimeError("enter_thread() moves the calling thread: call it in a thread of your own")
        fd = os.open(NETNS_DIR / self.name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {self.name}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def thread(self, target: Callable[..., Any], *args: Any, **kwargs: Any) -> threading.Thread:
        """A (not yet started, daemon) thread that enters this namespace, then runs ``target``."""

        def body() -> None:
            self.enter_thread()
            target(*args, **kwargs)

        return threading.Thread(target=body, name=f"netns-{self.name}", daemon=True)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = 300, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` in a fresh thread inside this namespace; return its result
        or raise its exception (e.g. connect to a server on this namespace's loopback)."""
        out: list[Any] = []
        errors: list[BaseException] = []

        def body() -> None:
            try:
                out.append(fn(*args, **kwargs))
            except BaseException as e:  # re-raised in the caller
                errors.append(e)

        t = self.thread(body)
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} in {self.name} still running after {timeout}s")
        if errors:
            raise errors[0]
        return out[0]  # type: ignore[no-any-return]

    def pids(self) -> list[int]:
        """The processes in this namespace (``ip netns pids``)."""
        return [int(p) for p in ip("netns", "pids", self.name, check=False).stdout.split()]

    def owns(self, pid: int) -> bool:
        """Whether process ``pid`` is in this namespace (``ip netns identify``)."""
        return self.name in ip("netns", "identify", str(pid), check=False).stdout.split()

    def __repr__(self) -> str:
        return f"Namespace({self.name})"


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of ``/proc/<pid>/stat``), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def sweep_stale() -> list[str]:
    """Remove the labs whose owning process is gone (a test run killed before its finalizers ran):
    kill what still runs in their namespaces and delete those.  Returns the tags swept; labs of
    live processes (other test runs of this machine) are left alone."""
    swept = []
    for owner in OWNERS_DIR.glob("*") if OWNERS_DIR.is_dir() else []:
        try:
            pid, start = owner.read_text().split()
        except (OSError, ValueError):
            continue
        if _process_start(int(pid)) == start:
            continue
        _remove(owner.name, [Namespace(n.name) for n in NETNS_DIR.glob(f"cdc-{owner.name}-*")], [])
        swept.append(owner.name)
    return swept


def _remove(tag: str, namespaces: list[Namespace], root_links: list[str]) -> None:
    for ns in namespaces:
        for pid in ns.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for ns in namespaces:
        ip("netns", "delete", ns.name, check=False)
    for dev in root_links:
        ip("link", "delete", dev, check=False)  # gone already when its peer's namespace went
    (OWNERS_DIR / tag).unlink(missing_ok=True)


def _used_networks() -> list[ipaddress.IPv4Network]:
    text = ip("-4", "-o", "addr", "show").stdout + ip("-4", "route", "show", "table", "all").stdout
    out = []
    for word in text.split():
        try:
            out.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    return [n for n in out if isinstance(n, ipaddress.IPv4Network)]


def free_network(base: str = "10.254.0.0/16") -> ipaddress.IPv4Network:
    """A random ``/24`` of ``base`` that no address or route of the root namespace overlaps
    (other labs of this machine included: their root-side links and routes are there)."""
    used = _used_networks()
    candidates = [
        n for n in ipaddress.IPv4Network(base).subnets(new_prefix=24) if n.network_address.packed[2]
    ]
    random.shuffle(candidates)
    for net in candidates:
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NetnsError(f"no free /24 left in {base}")


class Lab:
    """Namespaces and links of one test; :meth:`close` deletes them and kills what still runs there
    (a run killed before it could close is cleaned by the next one's :func:`sweep_stale`).

    :param network: the ``/24`` to take link subnets from (default: :func:`free_network`).
    """

    def __init__(self, network: str | ipaddress.IPv4Network | None = None) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.network = ipaddress.IPv4Network(network) if network else free_network()
        # the first /28 for service addresses (:meth:`address`), the rest for links
        self._addresses = next(self.network.subnets(new_prefix=28)).hosts()
        self._subnets = iter(list(self.network.subnets(new_prefix=30))[4:])
        self.namespaces: list[Namespace] = []
        self.root_links: list[str] = []
        self._links = 0
        OWNERS_DIR.mkdir(mode=0o700, exist_ok=True)
        (OWNERS_DIR / self.tag).write_text(f"{os.getpid()} {_process_start(os.getpid())}\n")

    def namespace(self, role: str) -> Namespace:
        """Create namespace ``cdc-<tag>-<role>`` with its loopback up."""
        ns = Namespace(f"cdc-{self.tag}-{role}")
        ip("netns", "add", ns.name)
        self.namespaces.append(ns)
        ip("-n", ns.name, "link", "set", "lo", "up")
        return ns

    def link(self, a: Namespace | None, b: Namespace | None) -> tuple[str, str]:
        """Join ``a`` and ``b`` (``None``: the root namespace) with a veth pair on the next ``/30``;
        return the two addresses (``a``'s, ``b``'s)."""
        subnet = next(self._subnets)
        hosts = [str(h) for h in subnet.hosts()]
        self._links += 1
        names = (f"c{self.tag}{self._links}a", f"c{self.tag}{self._links}b")
        ip("link", "add", names[0], "type", "veth", "peer", "name", names[1])
        for ns, dev, addr in ((a, names[0], hosts[0]), (b, names[1], hosts[1])):
            if ns is None:
                self.root_links.append(dev)
                ip("addr", "add", f"{addr}/30", "dev", dev)
                ip("link", "set", dev, "up")
            else:
                ip("link", "set", dev, "netns", ns.name)
                ip("-n", ns.name, "addr", "add", f"{addr}/30", "dev", dev)
                ip("-n", ns.name, "link", "set", dev, "up")
        return hosts[0], hosts[1]

    def address(self, ns: Namespace) -> str:
        """Give ``ns`` one more address (a ``/32`` on its loopback: reachable over every link that
        has a :meth:`route` to it) and return it."""
        addr = str(next(self._addresses))
        ip("-n", ns.name, "addr", "add", f"{addr}/32", "dev", "lo")
        return addr

    def route(self, ns: Namespace | None, dest: str, via: str) -> None:
        """Route ``dest`` (an address or network) from ``ns`` (``None``: root) via a link peer."""
        ip(*(("-n", ns.name) if ns else ()), "route", "add", dest, "via", via)

    def close(self) -> None:
        """Kill the processes left in the lab's namespaces, delete them (their veth ends go with
        them) and the root-side links.  Repeating it does nothing; errors are not raised."""
        _remove(self.tag, self.namespaces, self.root_links)
        self.namespaces, self.root_links = [], []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Lab({self.tag}, {self.network}, {[ns.name for ns in self.namespaces]})"
