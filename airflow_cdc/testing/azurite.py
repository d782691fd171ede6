"""A throwaway Azure Blob Storage server for the tests: Azurite, Microsoft's storage emulator.

Azurite (npm ``azurite``) is a real HTTP server speaking the Blob REST API with Shared Key
checks, over a workspace directory (``--location``).  ``make azurite`` installs it with npm into
``.local/azurite/`` (:data:`BIN_ENV` names another ``azurite-blob``); Node is already there for
the tedious cross-checks.  Tests that need it skip, saying so, without it.

Each server gets an account of its own with a random key (``AZURITE_ACCOUNTS``, Azurite's
README: "Customized Storage Accounts & Keys"), so a test can check the key stays out of
messages.  Telemetry is off (``--disableTelemetry``: Azurite collects it by default) and it
listens on loopback only.  Azurite has no Data Lake (DFS) endpoint (Azure/Azurite#409, open):
pyarrow finds no hierarchical namespace and works through the Blob API, and Spark's ABFS driver,
which speaks only DFS, cannot use it.  Its metadata (LokiJS) is saved every few seconds, so a
SIGKILL loses what was written just before it (containers included).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Self

from airflow_cdc.core.storage.settings import AzureSettings
from airflow_cdc.testing.servers import ServerStartError, free_port, log_tail

VERSION = "3.35.0"
BIN_ENV = "AIRFLOW_CDC_AZURITE_BIN"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO / ".local" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "cdcstaging"


def azurite_binary() -> Path | None:
    """Azurite's ``azurite-blob`` script, or None when it (or Node) is missing."""
    binary = Path(os.environ.get(BIN_ENV) or DEFAULT_BIN)
    return binary if binary.exists() and shutil.which("node") else None


class AzuriteServer:
    """Azurite's Blob service on ``127.0.0.1:<free port>`` with a workspace of its own.

    ``start`` waits until it answers; ``stop`` kills it (SIGKILL: like a crash) and keeps the
    workspace; ``start`` again serves it on the same port; ``close`` removes all.
    """

    def __init__(self, *, start_timeout: float = 30.0) -> None:
        binary = azurite_binary()
        if binary is None:
            raise ServerStartError(f"Azurite or node missing ({DEFAULT_BIN}): run `make azurite`")
        self.binary = binary
        self.base_dir = Path(tempfile.mkdtemp(prefix="cdc-azurite-"))
        self.port = free_port()
        self.account = ACCOUNT
        self.account_key = base64.b64encode(secrets.token_bytes(32)).decode()
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The account's Blob endpoint (path-style, as Azurite serves accounts)."""
        return f"http://127.0.0.1:{self.port}/{self.account}"

    @property
    def settings(self) -> AzureSettings:
        return AzureSettings(account_name=self.account, endpoint=self.endpoint, account_key=self.account_key)

    def env(self) -> dict[str, str]:
        """``AZURE_STORAGE_*`` variables (obstore's, adlfs') that point the libraries here."""
        return self.settings.env()

    def start(self) -> Self:
        """Start (or restart after :meth:`stop`) and wait until the port answers.

        :raises ServerStartError: with the log's tail when it does not come up in time.
        """
        if self._proc is not None and self._proc.poll() is None:
            return self
        log = open(self.base_dir / "azurite.log", "ab")  # noqa: SIM115 - the child keeps it
        self._proc = subprocess.Popen(
            [
                str(self.binary),
                *("--blobHost", "127.0.0.1", "--blobPort", str(self.port)),
                *("--location", str(self.base_dir / "workspace"), "--silent"),
                "--disableTelemetry",
                # obstore and pyarrow's Azure SDK send newer x-ms-version values than some
                # Azurite releases list; the operations used here exist in all of them
                "--skipApiVersionCheck",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.account_key}"},
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        tail = log_tail(self.base_dir / "azurite.log")
        raise ServerStartError(f"Azurite did not start on 127.0.0.1:{self.port}:\n{tail}")

    def stop(self) -> None:
        """Kill the server (its workspace stays for the next :meth:`start`)."""
        if self._proc is not None:
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
            self._proc = None

    def close(self) -> None:
        """Stop and remove the workspace."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def make_container(self, name: str | None = None) -> str:
        """Create a container (a fresh unique one by default) and return its name."""
        from spark_jobs.cdc_apply.delta_log import azure_filesystem

        name = name or f"cdc-{uuid.uuid4().hex[:12]}"
        azure_filesystem(self.account, self.endpoint, account_key=self.account_key).create_dir(name)
        return name

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AzuriteServer({self.endpoint}, dir={self.base_dir})"
