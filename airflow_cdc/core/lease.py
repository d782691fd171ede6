"""A per-connector lease: at most one capture, apply or commit of a connector works at a time.

Contract:

* The lease lives in the connector's state store, in a sibling store of lease records
  (:meth:`StateStore.lease_store`): ``{"token", "holder", "expires_at"}``, written only by
  compare-and-set, so of two runs racing for it exactly one wins.  Records are never deleted, so
  the **fencing token** only ever grows: every acquisition gets the previous token + 1.
* :func:`acquire` refuses (:class:`LeaseHeld`, retryable, naming host, pid, role and since) while
  another holder's lease is unexpired and that holder is not provably dead.  A holder is provably
  dead when it ran on this host and its pid is gone (a SIGKILLed run): its lease is taken over at
  once.  Otherwise an unrenewed lease is taken over after ``lease.timeout.ms``.
* A held :class:`Lease` renews itself from a daemon thread every third of the timeout.  If a
  renewal finds the lease taken over, the lease is *lost*: :meth:`Lease.check` raises
  :class:`LeaseLost` from then on.  Callers check at the points that matter (publishing a batch,
  the state commit) and pass the token on where a check cannot be made in-process (the apply's
  Delta commit metadata); :func:`fence_state` makes the state store itself reject a commit whose
  token is older than the one recorded by the last commit.
* Releasing is best effort (a crashed run never releases; expiry covers it) and keeps the token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from airflow_cdc.core.errors import LeaseHeld, LeaseLost, StateConflict
from airflow_cdc.core.state import StateStore, utc_now_iso

log = logging.getLogger(__name__)
_ATTEMPTS = 5


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a lease.  ``pidns`` tells apart processes that share a host name but
    not a pid space (containers with the host's name): only a pid in *our* pid space can be
    proven gone."""

    host: str
    pid: int
    run: str
    role: str
    since: str
    pidns: str = ""

    @classmethod
    def me(cls, role: str) -> Holder:
        return cls(socket.gethostname(), os.getpid(), uuid.uuid4().hex, role, utc_now_iso(), pid_namespace())

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Holder:
        return cls(
            str(doc["host"]),
            int(doc["pid"]),
            str(doc["run"]),
            str(doc["role"]),
            str(doc["since"]),
            str(doc.get("pidns", "")),
        )

    def describe(self) -> str:
        return f"{self.role} on host {self.host}, pid {self.pid}, since {self.since}"

    def provably_dead(self) -> bool:
        """True only when the holder ran in this host's pid space and its process no longer exists."""
        same_space = self.host == socket.gethostname() and self.pidns == pid_namespace()
        return same_space and not pid_alive(self.pid)


def pid_namespace() -> str:
    """An id of this process's pid namespace (Linux), else empty."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class Lease:
    """A held lease (see the module contract).  Use through :func:`hold`."""

    def __init__(self, store: StateStore, connector: str, holder: Holder, token: int, timeout: float) -> None:
        self.store, self.connector, self.holder = store, connector, holder
        self.token, self.timeout = token, timeout
        self.lost: LeaseLost | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def owner_json(self) -> dict[str, Any]:
        """Who writes on behalf of this lease (recorded in in-progress batch directories)."""
        return {**asdict(self.holder), "token": self.token}

    def _record(self) -> tuple[int | None, dict[str, Any]]:
        stored = self.store.load(self.connector)
        return (stored.version, stored.data) if stored else (None, {})

    def _mine(self, data: dict[str, Any]) -> bool:
        holder = data.get("holder") or {}
        return data.get("token") == self.token and holder.get("run") == self.holder.run

    def _lose(self, data: dict[str, Any]) -> LeaseLost:
        holder = data.get("holder")
        now = Holder.from_json(holder).describe() if holder else "nobody"
        self.lost = LeaseLost(
            f"connector {self.connector!r}: this run's lease (token {self.token}, {self.holder.describe()}) "
            f"was taken over (now token {data.get('token')}, held by {now})"
        )
        return self.lost

    def renew(self) -> None:
        """Extend the lease by the timeout; raise :class:`LeaseLost` if it is no longer ours."""
        with self._lock:
            if self.lost is not None:
                raise self.lost
            version, data = self._record()
            if not self._mine(data):
                raise self._lose(data)
            try:
                self.store.compare_and_set(
                    self.connector, version, {**data, "expires_at": time.time() + self.timeout}
                )
            except StateConflict:
                version, data = self._record()
                raise self._lose(data) from None

    check = renew  # checking is renewing: one compare-and-set proves we still hold it

    def start(self) -> None:
        self._thread = threading.Thread(target=self._keep, name=f"lease-{self.connector}", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.wait(self.timeout / 3):
            try:
                self.renew()
            except LeaseLost:
                log.error("%s", self.lost)
                return
            except Exception as e:  # noqa: BLE001 - a store blip: retry at the next tick, expiry is the limit
                log.warning("connector %s: lease renewal failed (%s); retrying", self.connector, e)

    def release(self) -> None:
        """Give the lease up (best effort; keeps the token so fencing never goes backwards)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock, contextlib.suppress(Exception):
            version, data = self._record()
            if self._mine(data):
                self.store.compare_and_set(self.connector, version, {**data, "holder": None, "expires_at": 0})


def acquire(store: StateStore, connector: str, role: str, timeout: float) -> Lease:
    """Take the lease of ``connector`` for ``role`` (see the module contract).

    :param timeout: seconds an unrenewed lease stays valid.
    :raises LeaseHeld: another live run holds it; retry later.
    """
    leases = store.lease_store()
    me = Holder.me(role)
    for _ in range(_ATTEMPTS):
        stored = leases.load(connector)
        data = stored.data if stored else {}
        previous = Holder.from_json(data["holder"]) if data.get("holder") else None
        if previous is not None and data.get("expires_at", 0) > time.time() and not previous.provably_dead():
            raise LeaseHeld(f"connector {connector!r} is busy: its lease is held by {previous.describe()}")
        token = int(data.get("token", 0)) + 1
        record = {"token": token, "holder": asdict(me), "expires_at": time.time() + timeout}
        try:
            leases.compare_and_set(connector, stored.version if stored else None, record)
        except StateConflict:
            continue  # someone else wrote the lease in between: look again
        if previous is not None:
            log.warning(
                "connector %s: took over the lease of %s (expired or dead)", connector, previous.describe()
            )
        lease = Lease(leases, connector, me, token, timeout)
        lease.start()
        return lease
    raise LeaseHeld(f"connector {connector!r}: the lease changed hands {_ATTEMPTS} times while taking it")


def fence_state(lease: Lease, stored: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Return ``new`` stamped with the lease's token; refuse if the store saw a newer token.

    :raises LeaseLost: the last commit came from a newer lease holder.
    """
    seen = int((stored or {}).get("fence", 0))
    if seen > lease.token:
        raise LeaseLost(
            f"connector {lease.connector!r}: the state was committed under lease token {seen}, "
            f"newer than this run's {lease.token}; this run's commit is refused"
        )
    return {**new, "fence": lease.token}


class Leases:
    """Reentrant lease holding for one connector's runner (a capture that commits holds one lease)."""

    def __init__(self, store: StateStore, connector: str, timeout: float) -> None:
        self.store, self.connector, self.timeout = store, connector, timeout
        self.current: Lease | None = None

    @contextlib.contextmanager
    def hold(self, role: str) -> Iterator[Lease]:
        """Hold the lease for the block (or reuse the one this runner already holds)."""
        if self.current is not None:
            yield self.current
            return
        lease = acquire(self.store, self.connector, role, self.timeout)
        self.current = lease
        try:
            yield lease
        finally:
            self.current = None
            lease.release()
