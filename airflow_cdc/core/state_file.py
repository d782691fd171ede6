"""A :class:`~airflow_cdc.core.state.StateStore` keeping one pretty-printed JSON file per connector.

Layout of the directory::

    <name>.json     the committed state: {"connector", "version", "updated_at", "state"}
    <name>.lock     lock file; compare-and-set holds an exclusive flock on it
    _leases/        the connector leases, in the same layout (see airflow_cdc.core.lease)
    .<name>.json.tmp-*  a write in progress (left behind only by a crash; removed by the next write)

``<name>`` is the connector name with every character outside ``[A-Za-z0-9_.-]`` (and a leading
``.``) percent-encoded as UTF-8, so distinct connectors never share a file; overlong names are cut
and suffixed with a hash.  A commit writes a temp file, fsyncs it, renames it over the old file
and fsyncs the directory, so a crash leaves the old or the new state, never a torn one.  The
lock serialises writers across processes on one host (flock is not reliable on network file
systems: use a SQL store for state shared between hosts).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow_cdc.core.errors import StateConflict
from airflow_cdc.core.filemodes import FILE_MODE, fsync_dir, private_dirs
from airflow_cdc.core.state import (
    StateCorrupt,
    StoredState,
    check_connector,
    check_expected_version,
    decode_state,
    encode_state,
    utc_now_iso,
)

_SAFE = re.compile(r"[A-Za-z0-9_.-]")
_MAX_STEM = 180  # bytes; leaves room for prefixes and suffixes within NAME_MAX (255)


def file_stem(connector: str) -> str:
    """Return the file name stem used for ``connector`` (injective, safe on any POSIX file system).

    :param connector: connector name.
    """
    out = []
    for i, ch in enumerate(connector):
        if _SAFE.fullmatch(ch) and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    stem = "".join(out)
    if len(stem) > _MAX_STEM:
        digest = hashlib.sha256(connector.encode("utf-8")).hexdigest()[:16]
        stem = f"{stem[: _MAX_STEM - 17]}~{digest}"
    return stem


class FileStateStore:
    """Connector states as JSON files in ``directory`` (created if missing).

    :param directory: the directory holding the state files.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser().absolute()
        private_dirs(self.directory)
        self._leases: FileStateStore | None = None

    def lease_store(self) -> FileStateStore:
        """The lease records, in ``<directory>/_leases`` (no connector file can be named so)."""
        if self._leases is None:
            self._leases = FileStateStore(self.directory / "_leases")
        return self._leases

    def describe(self) -> str:
        """Return ``file:<directory>``."""
        return f"file:{self.directory}"

    def _path(self, connector: str) -> Path:
        return self.directory / f"{file_stem(check_connector(connector))}.json"

    @contextlib.contextmanager
    def _locked(self, connector: str) -> Iterator[Path]:
        path = self._path(connector)
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield path
        finally:
            os.close(fd)  # closing releases the lock

    def load(self, connector: str) -> StoredState | None:
        """Return the committed state of ``connector`` or ``None``.

        :param connector: connector name.
        :raises StateCorrupt: when the file exists but is not a valid state file.
        """
        return self._read(self._path(connector), connector)

    def _read(self, path: Path, connector: str) -> StoredState | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            record = decode_state(text, str(path))
            version, state = record["version"], record["state"]
            if record.get("connector") != connector or not isinstance(version, int) or version < 1:
                raise ValueError("connector name or version does not match")
            if not isinstance(state, dict):
                raise ValueError("state is not a JSON object")
            return StoredState(version=version, data=state, updated_at=str(record["updated_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise StateCorrupt(f"state file {path} is not a valid state file: {exc}") from exc

    def compare_and_set(self, connector: str, expected_version: int | None, data: dict[str, Any]) -> int:
        """Commit ``data`` if the stored version is ``expected_version``; return the new version.

        :param connector: connector name.
        :param expected_version: version the caller loaded, ``None`` when it found no state.
        :param data: the new state (a JSON object).
        :raises StateConflict: when the stored version differs (another run committed first).
        """
        check_expected_version(expected_version)
        encode_state(data)  # validates: raises TypeError before anything is locked or written
        with self._locked(connector) as path:
            current = self._read(path, connector)
            found = current.version if current else None
            if found != expected_version:
                raise StateConflict(
                    f"state of connector {connector!r} in {self.describe()} is at version {found}, "
                    f"expected {expected_version}"
                )
            new_version = (found or 0) + 1
            record = {
                "connector": connector,
                "version": new_version,
                "updated_at": utc_now_iso(),
                "state": data,
            }
            self._write_atomic(path, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
            return new_version

    def _write_atomic(self, path: Path, text: str) -> None:
        for stale in self.directory.glob(f".{path.name}.tmp-*"):  # we hold the lock: left by a crash
            stale.unlink(missing_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as tmp:
                tmp.write(text)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.chmod(tmp_name, FILE_MODE)  # mkstemp makes 0600 already; say so in case that changes
            os.replace(tmp_name, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        fsync_dir(self.directory)

    def delete(self, connector: str) -> None:
        """Remove the state of ``connector``; no error when it has none.

        :param connector: connector name.
        """
        with self._locked(connector) as path:
            try:
                path.unlink()
            except FileNotFoundError:
                return
            fsync_dir(self.directory)

    def __repr__(self) -> str:
        return f"FileStateStore({str(self.directory)!r})"
