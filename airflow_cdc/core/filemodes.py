"""Owner-only permissions for what the connector writes locally (state files and staged batches),
and the fsyncs that make those files durable.

Staged batches hold full row images and the state names offsets (and, for some stores, hosts), so
nothing the connector creates is readable by other users: files ``0600``, directories ``0700``,
whatever the process umask.  The modes are set explicitly with ``chmod`` because ``mkdir`` and
``open`` only ever *remove* bits through the umask; a umask of ``0o022`` would leave them
world-readable.  Directories that already exist are left as they are (they may be shared on
purpose, e.g. a staging root several connectors write under).
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dirs(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and any missing parents, each new one ``0700``; return the path.

    Repeating it is a no-op.  Existing directories keep their modes.
    """
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another process made it first: its mode is its business
            continue
        os.chmod(d, DIR_MODE)
    return path


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create one new directory ``0700`` (its parent must exist).

    :raises FileExistsError: when it exists already.
    """
    path = Path(path)
    path.mkdir(mode=DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


def make_private(path: str | os.PathLike[str]) -> None:
    """Restrict a file to its owner (``0600``), or a directory (``0700``)."""
    os.chmod(path, DIR_MODE if Path(path).is_dir() else FILE_MODE)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data and metadata (its mode too) to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries to disk (files created, renamed or removed in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
