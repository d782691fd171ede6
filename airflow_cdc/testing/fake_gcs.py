"""A throwaway GCS server for the tests: fake-gcs-server (``github.com/fsouza/fake-gcs-server``).

fake-gcs-server is a real HTTP server speaking Google's JSON API over a filesystem backend that
survives a restart.  ``make fake-gcs`` builds it from the Go module proxy into a cache outside
the clone (:data:`BIN_ENV` names another binary); tests that need it skip, saying so, without it.

One gap, bridged here: obstore (Rust ``object_store``) uploads through GCS's *XML* API
(``PUT /<bucket>/<object>``, ``x-goog-if-generation-match: 0`` for a create), which upstream
fake-gcs-server does not serve: it answers ``400 invalid uploadType`` (fsouza/fake-gcs-server#1164;
object_store's own CI runs a patched fork for this).  So the server's clients reach it through
:class:`_XmlBridge`, a loopback proxy that passes every request through unchanged except that
one, which it turns into the JSON API's media upload with ``ifGenerationMatch`` -- the precondition
fake-gcs-server checks under its backend lock, which is what the race tests exercise.  The bridge
runs in a process of its own: pyarrow's GCS reads hold the GIL while they wait (a bridge thread
in the test's process deadlocked a ``ParquetFile`` open until its timeout).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Self
from urllib.parse import quote, unquote, urlsplit

from airflow_cdc.testing.servers import ServerStartError, free_port, log_tail

if TYPE_CHECKING:  # the bridge's process stays light (no pyarrow): it starts in ~0.1 s
    from airflow_cdc.core.storage.settings import GcsSettings

VERSION = "v1.56.1"
BIN_ENV = "AIRFLOW_CDC_FAKE_GCS_BIN"
# the Makefile's FAKE_GCS_DIR: /var/cache as root, else ~/.cache
_CACHE = Path("/var/cache") if os.geteuid() == 0 else Path.home() / ".cache"
DEFAULT_BIN = _CACHE / "airflow-cdc" / f"fake-gcs-server-{VERSION}" / "bin" / "fake-gcs-server"
PROJECT = "cdc-test"


def fake_gcs_binary() -> Path | None:
    """The fake-gcs-server binary, or None when it is missing."""
    binary = Path(os.environ.get(BIN_ENV) or DEFAULT_BIN)
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


class FakeGcsServer:
    """fake-gcs-server on ``127.0.0.1:<free port>`` behind the XML bridge, data of its own.

    ``start`` waits until it answers; ``stop`` kills it (SIGKILL: like a crash) and closes the
    bridge, keeping the data; ``start`` again serves the same objects on the same port;
    ``close`` removes all.  Clients send no credentials (it checks none).
    """

    def __init__(self, *, start_timeout: float = 30.0) -> None:
        binary = fake_gcs_binary()
        if binary is None:
            raise ServerStartError(f"fake-gcs-server missing ({DEFAULT_BIN}): run `make fake-gcs`")
        self.binary = binary
        self.base_dir = Path(tempfile.mkdtemp(prefix="cdc-fake-gcs-"))
        self.port, self.backend_port = free_port(), free_port()
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._bridge: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def settings(self) -> GcsSettings:
        from airflow_cdc.core.storage.settings import GcsSettings

        return GcsSettings(endpoint=self.endpoint, project_id=PROJECT, anonymous=True)

    def env(self) -> dict[str, str]:
        """``STORAGE_EMULATOR_HOST`` (what Google's libraries read for an emulator) and the
        project, as a deployment against an emulator sets them."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": PROJECT}

    def start(self) -> Self:
        """Start (or restart after :meth:`stop`) and wait until it answers.

        :raises ServerStartError: with the log's tail when it does not come up in time.
        """
        if self._proc is not None and self._proc.poll() is None:
            return self
        log = open(self.base_dir / "fake-gcs.log", "ab")  # noqa: SIM115 - the child keeps it
        self._proc = subprocess.Popen(
            [
                str(self.binary),
                *("-host", "127.0.0.1", "-port", str(self.backend_port), "-scheme", "http"),
                *("-backend", "filesystem", "-filesystem-root", str(self.base_dir / "data")),
                # uploads' Location headers and host-matched routes name the bridge
                *("-public-host", f"127.0.0.1:{self.port}", "-external-url", self.endpoint),
                *("-log-level", "warn"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._bridge = subprocess.Popen(
            [sys.executable, "-m", __name__, str(self.port), str(self.backend_port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        ports = [self.backend_port, self.port]
        while (
            ports
            and time.monotonic() < deadline
            and self._proc.poll() is None
            and self._bridge.poll() is None
        ):
            try:
                with socket.create_connection(("127.0.0.1", ports[0]), timeout=0.5):
                    ports.pop(0)
            except OSError:
                time.sleep(0.1)
        if not ports:
            return self
        self.stop()
        tail = log_tail(self.base_dir / "fake-gcs.log")
        raise ServerStartError(f"fake-gcs-server did not start on 127.0.0.1:{self.port}:\n{tail}")

    def stop(self) -> None:
        """Kill the server and the bridge (the data stays for the next :meth:`start`)."""
        for attr in ("_bridge", "_proc"):
            proc: subprocess.Popen[bytes] | None = getattr(self, attr)
            if proc is not None:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                setattr(self, attr, None)

    def close(self) -> None:
        """Stop and remove the data."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one by default) and return its name."""
        name = name or f"cdc-{uuid.uuid4().hex[:12]}"
        body = json.dumps({"name": name}).encode()
        _request("127.0.0.1", self.backend_port, "POST", f"/storage/v1/b?project={PROJECT}", body, {})
        return name

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FakeGcsServer({self.endpoint}, dir={self.base_dir})"


# hop-by-hop headers (the Host goes through: fake-gcs-server matches routes on it)
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _request(
    host: str, port: int, method: str, target: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, list[tuple[str, str]], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=20)
    try:
        conn.request(method, target, body, headers)
        response = conn.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        conn.close()


class _XmlBridge:
    """A loopback HTTP proxy in front of fake-gcs-server: passes requests through, except an
    XML-API object upload, which it sends as a JSON-API media upload with the same precondition
    (and answers with the XML API's ``ETag`` / ``x-goog-generation`` headers, as object_store
    expects)."""

    def __init__(self, port: int, backend_port: int) -> None:
        bridge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_PUT(self) -> None:
                body = self._body()
                path = urlsplit(self.path).path
                if not path.startswith(("/upload/", "/storage/")) and "uploadType" not in self.path:
                    self._reply(*bridge.xml_put(path, body, dict(self.headers)))
                else:
                    self._reply(*bridge.forward(self.command, self.path, body, dict(self.headers)))

            def _pass(self) -> None:
                self._reply(*bridge.forward(self.command, self.path, self._body(), dict(self.headers)))

            do_GET = do_POST = do_DELETE = do_PATCH = do_HEAD = _pass  # noqa: N815

            def _body(self) -> bytes | None:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

        self.backend_port = backend_port
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)

    def forward(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = {k: v for k, v in headers.items() if k.lower() not in _HOP}
        try:
            return _request("127.0.0.1", self.backend_port, method, target, body, headers)
        except OSError as e:
            return 502, [], str(e).encode()

    def xml_put(
        self, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        bucket, _, name = unquote(path).lstrip("/").partition("/")
        query = f"uploadType=media&name={quote(name, safe='')}"
        lowered = {k.lower(): v for k, v in headers.items()}
        if "x-goog-if-generation-match" in lowered:
            query += f"&ifGenerationMatch={lowered['x-goog-if-generation-match']}"
        kind = {"Content-Type": lowered.get("content-type") or "application/octet-stream"}
        status, out, data = self.forward(
            "POST", f"/upload/storage/v1/b/{quote(bucket)}/o?{query}", body, kind
        )
        if status != 200:
            return status, out, data
        attrs = json.loads(data)
        return (
            200,
            [("ETag", f'"{attrs.get("etag", "")}"'), ("x-goog-generation", str(attrs["generation"]))],
            b"",
        )


if __name__ == "__main__":  # the bridge's process: <port> <fake-gcs-server's port>
    _XmlBridge(int(sys.argv[1]), int(sys.argv[2])).server.serve_forever()
