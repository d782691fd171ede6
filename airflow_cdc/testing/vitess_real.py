"""A throwaway real Vitess cluster on loopback: one keyspace over MariaDB shards, for tests.

The layout is the one Vitess documents for external ("unmanaged") MySQL-compatible databases:

* one throwaway MariaDB 10.11 server per shard (:class:`~airflow_cdc.testing.servers.MariaDbServer`:
  row-based binlog, full row image, GTIDs; each shard its own ``server-id``);
* an ``etcd`` (Debian's ``etcd-server``) as the topology server;
* one ``vttablet --unmanaged`` per shard, registered as REPLICA (the only types ``--init-tablet-type``
  accepts) and then made PRIMARY with ``vtctldclient --server internal TabletExternallyReparented``;
* one ``vtgate`` (gRPC for VStream, and the MySQL protocol without authentication).

The Vitess binaries come from the directory named by ``AIRFLOW_CDC_VITESS_BIN``, or else from
``~/.cache/airflow-cdc/vitess-<VITESS_VERSION>/bin`` (``/var/cache/...`` as root, where ``nobody`` can
reach them), where ``make setup`` (``make vitess``) builds them from the Go module
``vitess.io/vitess``.  Vitess refuses to run as root, so as root the Vitess processes run as
``nobody``.  Everything listens on 127.0.0.1 on free ports; the logs are under
:attr:`RealVitessCluster.log_dir`, kept after :meth:`~RealVitessCluster.stop` only with ``keep_logs``.

Positions from MariaDB shards read ``MariaDB/<domain>-<server>-<seq>``, not ``MySQL56/<uuid>:1-N``
(:class:`airflow_cdc.sources.vitess.offsets.GtidSet` reads both).

Example::

    with RealVitessCluster() as vt:
        vt.execute("INSERT INTO customer (id, name) VALUES (%s, %s)", (1, "a"))
        VtgateClient(vitess_config({..., "database.hostname": vt.host, "database.port": vt.grpc_port}))
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from airflow_cdc.testing.servers import MariaDbServer, ServerStartError, apt_install, free_port, log_tail

VITESS_BIN_ENV = "AIRFLOW_CDC_VITESS_BIN"
VITESS_VERSION = "v0.24.4"  # the Makefile's VITESS_VERSION (a unit test keeps them equal)
VITESS_BINARIES = ("vtgate", "vttablet", "vtctldclient")
ETCD_PACKAGES = ("etcd-server",)
DEFAULT_TABLES: dict[str, str] = {"customer": "id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(64)"}

_LIVE: set[RealVitessCluster] = set()


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        try:
            cluster.stop()
        except Exception:  # best effort at exit
            pass


def vitess_bin() -> Path:
    """The directory of the Vitess binaries: ``AIRFLOW_CDC_VITESS_BIN``, or the cache ``make vitess``
    builds into (``~/.cache/airflow-cdc/vitess-<version>/bin``; ``/var/cache/...`` as root)."""
    if os.environ.get(VITESS_BIN_ENV):
        return Path(os.environ[VITESS_BIN_ENV])
    cache = Path("/var/cache") if os.geteuid() == 0 else Path.home() / ".cache"
    return cache / "airflow-cdc" / f"vitess-{VITESS_VERSION}" / "bin"


def missing() -> str | None:
    """Why a cluster cannot start here (a missing binary), or None when it can.

    ``etcd`` alone is installed on demand (as root, from Debian) by :meth:`RealVitessCluster.start`.
    """
    folder = vitess_bin()
    absent = [b for b in VITESS_BINARIES if not os.access(folder / b, os.X_OK)]
    if absent:
        return f"no Vitess binaries {absent} in {folder}: run `make vitess` (part of `make setup`)"
    if shutil.which("etcd") is None and os.geteuid() != 0:
        return "no etcd (apt-get install etcd-server)"
    return None


def _ensure_etcd() -> str:
    found = shutil.which("etcd")
    if found:
        return found
    if os.geteuid() != 0:
        raise ServerStartError("etcd is missing; install Debian's etcd-server")
    apt_install(ETCD_PACKAGES)
    found = shutil.which("etcd")
    if not found:
        raise ServerStartError(f"installed {ETCD_PACKAGES} but there is still no etcd")
    return found


def _fetch(conn: Any, statement: str, params: Any) -> list[tuple[Any, ...]]:
    """Run one statement on ``conn`` and close it; the rows it returned."""
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall())
    finally:
        conn.close()


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class RealVitessCluster:
    """A keyspace of real Vitess over one throwaway MariaDB server per shard.

    :param keyspace: keyspace name; each shard's database is ``vt_<keyspace>``.
    :param shards: shard names (key ranges covering the whole key space, e.g. ``("-80", "80-")``;
        ``("0",)`` for an unsharded keyspace).
    :param tables: table name -> column definitions, created on every shard before the tablets start.
    :param vindex_columns: table -> column of its ``hash`` vindex (default ``id``); unused when unsharded.
    :param tablet_flags: extra ``vttablet`` flags (e.g. ``--vstream-packet-size=200`` with
        ``--vstream-dynamic-packet-size=false`` for copy chunks of a few rows).
    :param start_timeout: seconds each step may take to come up.
    :param keep_logs: keep :attr:`log_dir` after :meth:`stop`.
    """

    cell = "zone1"

    def __init__(
        self,
        keyspace: str = "ks",
        shards: Sequence[str] = ("-80", "80-"),
        tables: Mapping[str, str] | None = None,
        vindex_columns: Mapping[str, str] | None = None,
        *,
        tablet_flags: Sequence[str] = (),
        start_timeout: float = 90.0,
        keep_logs: bool = False,
    ) -> None:
        self.keyspace = keyspace
        self.shards = list(shards)
        self.tables = dict(DEFAULT_TABLES if tables is None else tables)
        self.vindex_columns = dict(vindex_columns or {})
        self.tablet_flags = list(tablet_flags)
        self.start_timeout = start_timeout
        self.keep_logs = keep_logs
        self.host = "127.0.0.1"
        self.grpc_port = 0
        self.mysql_port = 0
        self.http_port = 0
        self.etcd_port = 0
        self.base_dir: Path | None = None
        self.shard_servers: dict[str, MariaDbServer] = {}
        self.tablet_aliases: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- addresses ---------------------------------------------------------------------------

    @property
    def addr(self) -> str:
        """vtgate's gRPC address, ``127.0.0.1:<port>`` (``AIRFLOW_CDC_VTGATE_ADDR``)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def db_name(self) -> str:
        return f"vt_{self.keyspace}"

    @property
    def log_dir(self) -> Path:
        assert self.base_dir is not None, "cluster not started"
        return self.base_dir / "logs"

    @property
    def sharded(self) -> bool:
        return self.shards != ["0"] and self.shards != ["-"]

    def vschema(self) -> dict[str, Any]:
        if not self.sharded:
            return {"sharded": False, "tables": {t: {} for t in self.tables}}
        return {
            "sharded": True,
            "vindexes": {"hash": {"type": "hash"}},
            "tables": {
                t: {"column_vindexes": [{"column": self.vindex_columns.get(t, "id"), "name": "hash"}]}
                for t in self.tables
            },
        }

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> Self:
        """Start MariaDB shards, etcd, the tablets and vtgate; return once vtgate routes to every shard.

        :raises ServerStartError: a binary is missing or a process did not come up (log tails included).
        """
        if self.base_dir is not None:
            return self
        reason = missing()
        if reason:
            raise ServerStartError(reason)
        etcd = _ensure_etcd()
        self.base_dir = Path(tempfile.mkdtemp(prefix="cdc-vitess-"))
        self.base_dir.chmod(0o755)
        self.log_dir.mkdir()
        (self.base_dir / "vtdataroot").mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.base_dir / "vtdataroot", "nobody", "nogroup")
        _LIVE.add(self)
        began = time.monotonic()
        try:
            self._start_shards()
            self.timings["mariadb"] = time.monotonic() - began
            self._start_etcd(etcd)
            self._init_topology()
            self.timings["etcd+topology"] = time.monotonic() - began - self.timings["mariadb"]
            mark = time.monotonic()
            self._start_tablets()
            self.timings["tablets"] = time.monotonic() - mark
            mark = time.monotonic()
            self._start_vtgate()
            self.timings["vtgate"] = time.monotonic() - mark
            self.timings["total"] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        return self

    def _start_shards(self) -> None:
        for i, shard in enumerate(self.shards):
            server = MariaDbServer(settings={"server-id": str(i + 1)})
            self.shard_servers[shard] = server
            server.start()
            conn = server.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute(f"CREATE DATABASE `{self.db_name}`")
                    for table, columns in self.tables.items():
                        cur.execute(f"CREATE TABLE `{self.db_name}`.`{table}` ({columns})")
                conn.commit()
            finally:
                conn.close()

    def _spawn(self, name: str, args: list[str], vitess: bool = True) -> subprocess.Popen[bytes]:
        assert self.base_dir is not None
        log = open(self.log_dir / f"{name}.log", "wb")
        extra: dict[str, Any] = {}
        if vitess and os.geteuid() == 0:  # servenv.Init exits when run as root
            extra = {"user": "nobody", "group": "nogroup", "extra_groups": []}
        env = dict(os.environ, VTDATAROOT=str(self.base_dir / "vtdataroot"))
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir / "vtdataroot",
                env=env,
                start_new_session=True,
                **extra,
            )
        finally:
            log.close()
        self._procs[name] = proc
        return proc

    def _wait_port(self, name: str, port: int) -> None:
        proc = self._procs[name]
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServerStartError(
                    f"{name} exited ({proc.returncode}); log tail:\n{log_tail(self.log_dir / f'{name}.log')}"
                )
            try:
                socket.create_connection((self.host, port), 0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise ServerStartError(
            f"{name} did not listen on {port}; log tail:\n{log_tail(self.log_dir / f'{name}.log')}"
        )

    def _start_etcd(self, etcd: str) -> None:
        assert self.base_dir is not None
        self.etcd_port, peer, metrics = free_port(), free_port(), free_port()
        client_url, peer_url = f"http://{self.host}:{self.etcd_port}", f"http://{self.host}:{peer}"
        self._spawn(
            "etcd",
            [
                etcd,
                "--name=n1",
                f"--data-dir={self.base_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=n1={peer_url}",
                f"--listen-metrics-urls=http://{self.host}:{metrics}",
            ],
            vitess=False,
        )
        self._wait_port("etcd", self.etcd_port)

    def _topo_flags(self) -> list[str]:
        return [
            "--topo-implementation=etcd2",
            f"--topo-global-server-address={self.host}:{self.etcd_port}",
            "--topo-global-root=/vitess/global",
        ]

    def vtctl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``vtctldclient --server internal`` (straight against the topology) with ``args``."""
        proc = subprocess.run(
            [str(vitess_bin() / "vtctldclient"), "--server=internal", *self._topo_flags(), *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ServerStartError(
                f"vtctldclient {' '.join(args)} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}"
            )
        return proc

    def _init_topology(self) -> None:
        self.vtctl("AddCellInfo", "--root", f"/vitess/{self.cell}", "--server-address",
                   f"{self.host}:{self.etcd_port}", self.cell)  # fmt: skip
        self.vtctl("CreateKeyspace", self.keyspace)
        self.vtctl("ApplyVSchema", "--vschema", json.dumps(self.vschema()), self.keyspace)

    def _start_tablets(self) -> None:
        grpc_ports = {}
        for i, shard in enumerate(self.shards):
            server = self.shard_servers[shard]
            alias = f"{self.cell}-{100 + i}"
            self.tablet_aliases[shard] = alias
            creds = []
            for user in ("app", "dba", "filtered", "repl", "allprivs", "appdebug", "erepl"):
                creds += [f"--db-{user}-user=root", f"--db-{user}-password={server.password}"]
            grpc_ports[alias] = free_port()
            self._spawn(
                f"vttablet-{alias}",
                [
                    str(vitess_bin() / "vttablet"),
                    *self._topo_flags(),
                    f"--tablet-path={alias}",
                    f"--init-keyspace={self.keyspace}",
                    f"--init-shard={shard}",
                    "--init-tablet-type=replica",
                    f"--init-db-name-override={self.db_name}",
                    "--unmanaged",
                    f"--db-host={server.host}",
                    f"--db-port={server.port}",
                    *creds,
                    "--db-charset=utf8mb4",
                    f"--port={free_port()}",
                    f"--grpc-port={grpc_ports[alias]}",
                    f"--bind-address={self.host}",
                    f"--grpc-bind-address={self.host}",
                    f"--tablet-hostname={self.host}",
                    "--service-map=grpc-queryservice,grpc-tabletmanager,grpc-updatestream",
                    "--health-check-interval=1s",
                    *self.tablet_flags,
                ],
            )
        for alias, port in grpc_ports.items():
            self._wait_port(f"vttablet-{alias}", port)
        for alias in grpc_ports:  # the tablet record appears shortly after its gRPC port
            deadline = time.monotonic() + self.start_timeout
            while True:
                proc = self.vtctl("TabletExternallyReparented", alias, check=False)
                if proc.returncode == 0:
                    break
                if time.monotonic() > deadline or self._procs[f"vttablet-{alias}"].poll() is not None:
                    raise ServerStartError(
                        f"TabletExternallyReparented {alias}: {proc.stderr[-1500:]}\n"
                        f"tablet log tail:\n{log_tail(self.log_dir / f'vttablet-{alias}.log')}"
                    )
                time.sleep(0.5)

    def _start_vtgate(self) -> None:
        self.grpc_port, self.mysql_port, self.http_port = free_port(), free_port(), free_port()
        self._spawn(
            "vtgate",
            [
                str(vitess_bin() / "vtgate"),
                *self._topo_flags(),
                f"--cell={self.cell}",
                f"--cells-to-watch={self.cell}",
                "--tablet-types-to-wait=PRIMARY",
                f"--port={self.http_port}",
                f"--grpc-port={self.grpc_port}",
                f"--mysql-server-port={self.mysql_port}",
                f"--mysql-server-bind-address={self.host}",
                f"--bind-address={self.host}",
                f"--grpc-bind-address={self.host}",
                "--mysql-auth-server-impl=none",
                "--service-map=grpc-vtgateservice",
            ],
        )
        self._wait_port("vtgate", self.grpc_port)
        self._wait_port("vtgate", self.mysql_port)
        deadline = time.monotonic() + self.start_timeout
        while True:  # every shard's primary serving, and a query reaching all shards
            try:
                rows = self.execute("SHOW VITESS_TABLETS")
                serving = {
                    r[2] for r in rows if r[1] == self.keyspace and r[3] == "PRIMARY" and r[4] == "SERVING"
                }
                if serving >= set(self.shards):
                    for table in self.tables:
                        self.execute(f"SELECT COUNT(*) FROM `{table}`")  # noqa: S608 (test table names)
                    return
            except Exception as e:  # pymysql errors while vtgate warms up
                last = repr(e)
            else:
                last = f"serving primaries: {sorted(serving)}"
            if time.monotonic() > deadline or self._procs["vtgate"].poll() is not None:
                raise ServerStartError(
                    f"vtgate not ready ({last}); log tail:\n{log_tail(self.log_dir / 'vtgate.log')}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Kill every process at once (SIGKILL), stop the MariaDB shards, delete the temp dir."""
        _LIVE.discard(self)
        for proc in reversed(list(self._procs.values())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for server in self.shard_servers.values():
            server.stop()
        self.shard_servers.clear()
        if self.base_dir is not None and not self.keep_logs:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        self.base_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"RealVitessCluster({self.keyspace}/{','.join(self.shards)} at {self.addr}, dir={self.base_dir})"
        )

    # -- data and measurements ---------------------------------------------------------------

    def props(self, name: str, staging: str | os.PathLike[str], **extra: Any) -> dict[str, Any]:
        """A Vitess connector config against this cluster's vtgate (``extra`` wins); a 20 s window
        idle timeout and a 5 s lease, as the tests use them."""
        return {
            "name": name, "connector": "vitess", "staging.path": str(staging),
            "database.hostname": self.host, "database.port": self.grpc_port,
            "vitess.keyspace": self.keyspace, "vitess.window.idle.timeout": 20,
            "lease.timeout.ms": 5000, **extra,
        }  # fmt: skip

    def connect(self, **kwargs: Any) -> Any:
        """A pymysql connection to vtgate's MySQL port, database = the keyspace (no authentication)."""
        import pymysql

        params = {"host": self.host, "port": self.mysql_port, "user": "root", "password": "",
                  "database": self.keyspace, "autocommit": True, "connect_timeout": 10, **kwargs}  # fmt: skip
        return pymysql.connect(**params)

    def execute(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement through vtgate (autocommit) and return its rows.

        vtgate routes by the vschema: an INSERT must name its columns (VT09004 otherwise).
        """
        return _fetch(self.connect(), statement, params)

    def execute_on_shard(self, shard: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement straight on a shard's MariaDB, in its database ``vt_<keyspace>``."""
        conn = self.shard_servers[shard].connect(database=self.db_name, autocommit=True)
        return _fetch(conn, statement, params)

    def shard_gtid(self, shard: str) -> str:
        """The shard's ``@@gtid_binlog_pos`` as Vitess spells it (``MariaDB/<domain>-<server>-<seq>``)."""
        return "MariaDB/" + str(self.execute_on_shard(shard, "SELECT @@gtid_binlog_pos")[0][0])

    def pids(self) -> dict[str, int]:
        """Process ids by name (the Vitess processes, etcd, ``mariadbd-<shard>``)."""
        out = {name: p.pid for name, p in self._procs.items() if p.poll() is None}
        for shard, server in self.shard_servers.items():
            pid_file = server.log_file.with_name("mysqld.pid")
            try:
                out[f"mariadbd-{shard}"] = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return out

    def memory_kib(self) -> dict[str, int]:
        """Resident memory (VmRSS, KiB) of every process of the cluster, by name."""
        return {name: _rss_kib(pid) for name, pid in self.pids().items()}
