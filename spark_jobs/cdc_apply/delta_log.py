"""Read a Delta table's transaction identifiers and commit info straight from ``_delta_log``.

Delta records idempotent writes as ``txn`` actions (``appId`` -> ``version``).  Reading them
needs no Spark: the newest checkpoint (Parquet) plus the JSON commits after it.  The apply job
uses this to skip tables a batch already reached; the Airflow commit step uses it to tell
"applied but not committed" from "not applied" after a crash.  Works on local paths and any
filesystem ``pyarrow.fs`` understands.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs
import pyarrow.parquet as pq

#: table property that turns on Delta change data feed
CHANGE_FEED = "delta.enableChangeDataFeed"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d{10}\.\d{10})?\.parquet$")


#: S3 settings of this process, from Hadoop's S3A keys (:func:`use_hadoop_conf`); the
#: environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` ...) fills the rest
_S3A: dict[str, str] = {}
S3A_KEYS = {
    "fs.s3a.endpoint": "endpoint",
    "fs.s3a.endpoint.region": "region",
    "fs.s3a.path.style.access": "path_style",
    "fs.s3a.access.key": "access_key",
    "fs.s3a.secret.key": "secret_key",
    "fs.s3a.session.token": "session_token",
}


def use_hadoop_conf(conf: Mapping[str, str]) -> None:
    """Read S3 endpoint and credentials from Hadoop S3A keys (``fs.s3a.endpoint`` ..., with or
    without ``spark.hadoop.``), so pyarrow reaches the same store as Spark."""
    for key, value in conf.items():
        name = S3A_KEYS.get(key.removeprefix("spark.hadoop."))
        if name and value:
            _S3A[name] = str(value)


def _s3_setting(name: str, *env: str) -> str | None:
    return _S3A.get(name) or next((os.environ[e] for e in env if os.environ.get(e)), None)


def _s3_filesystem() -> pafs.FileSystem:
    endpoint = _s3_setting("endpoint", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    path_style = _S3A.get("path_style")
    return _cached_s3(
        endpoint,
        _s3_setting("region", "AWS_REGION", "AWS_DEFAULT_REGION"),
        (path_style or "").lower() == "true" if path_style is not None else endpoint is not None,
        _S3A.get("access_key"),
        _S3A.get("secret_key"),
        _S3A.get("session_token"),
    )


@lru_cache(maxsize=8)
def _cached_s3(
    endpoint: str | None,
    region: str | None,
    path_style: bool,
    access_key: str | None,
    secret_key: str | None,
    token: str | None,
) -> pafs.FileSystem:
    scheme = "https"
    if endpoint and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    return pafs.S3FileSystem(
        access_key=access_key,
        secret_key=secret_key,
        session_token=token,
        region=region,
        endpoint_override=endpoint,
        scheme=scheme,
        force_virtual_addressing=not path_style,
        connect_timeout=20,
        request_timeout=20,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3),
    )


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for ``path`` and the path within it (local for plain paths).

    ``s3://`` and Hadoop's ``s3a://`` name the same objects: both get pyarrow's S3 filesystem
    with the settings of :func:`use_hadoop_conf` and the environment (``bucket/key`` paths).
    """
    scheme = path.split("://", 1)[0] if "://" in path else ""
    if scheme in ("s3", "s3a"):
        return _s3_filesystem(), path.split("://", 1)[1].rstrip("/")
    if scheme and scheme != "file":
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path.removeprefix("file://")


def hadoop_url(path: str) -> str:
    """``path`` as Spark names it: ``s3://`` is ``s3a://`` to Hadoop."""
    return "s3a://" + path[len("s3://") :] if path.startswith("s3://") else path


def _listing(fs: pafs.FileSystem, log_dir: str) -> list[str]:
    try:
        infos = fs.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [i.base_name for i in infos if i.type == pafs.FileType.File]


def table_exists(table_path: str) -> bool:
    fs, local = filesystem(table_path)
    return any(_COMMIT.match(n) for n in _listing(fs, f"{local}/_delta_log"))


@dataclass
class LogState:
    """What the apply job needs from a table's log: idempotent writes and live data files."""

    txns: dict[str, int] = field(default_factory=dict)
    files: dict[str, int | None] = field(default_factory=dict)  # path -> numRecords, if recorded
    configuration: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # path -> bytes on storage
    deleted: dict[str, int] = field(default_factory=dict)  # path -> rows its deletion vector hides

    def has_applied(self, app_id: str, version: int = 1) -> bool:
        return self.txns.get(app_id, -1) >= version

    @property
    def records(self) -> int | None:
        """Rows in the current version, from file statistics (None when a file has none)."""
        total = 0
        for count in self.files.values():
            if count is None:
                return None
            total += count
        return total

    def _add(self, add: dict[str, Any]) -> None:
        stats = add.get("stats")
        records = json.loads(stats).get("numRecords") if stats else None
        deleted = (add.get("deletionVector") or {}).get("cardinality") or 0
        self.files[add["path"]] = None if records is None else int(records) - int(deleted)
        self.sizes[add["path"]] = int(add.get("size") or 0)
        self.deleted[add["path"]] = int(deleted)


def replay(table_path: str) -> LogState:
    """Replay the newest checkpoint and the commits after it (an empty state if there is no table)."""
    fs, local = filesystem(table_path)
    log_dir = f"{local}/_delta_log"
    names = _listing(fs, log_dir)
    checkpoints: dict[int, list[str]] = {}
    for n in names:
        m = _CHECKPOINT.match(n)
        if m:
            checkpoints.setdefault(int(m.group(1)), []).append(n)
    state = LogState()
    start = -1
    if checkpoints:
        start = max(checkpoints)
        for name in checkpoints[start]:
            table = pq.read_table(f"{log_dir}/{name}", columns=["txn", "add", "metaData"], filesystem=fs)
            for txn in table.column("txn").to_pylist():
                if txn:
                    state.txns[txn["appId"]] = txn["version"]
            for add in table.column("add").to_pylist():
                if add:
                    state._add(add)
            for meta in table.column("metaData").to_pylist():
                if meta:
                    state.configuration = dict(meta.get("configuration") or {})
    commits = sorted(int(m.group(1)) for n in names if (m := _COMMIT.match(n)))
    for version in commits:
        if version <= start:
            continue
        _apply_commit(state, _actions(fs, f"{log_dir}/{version:020d}.json"))
    return state


def _apply_commit(state: LogState, actions: list[dict[str, Any]]) -> None:
    """One commit's actions.  Removes go first: a commit that gives a file a new deletion vector
    removes and re-adds the same path (with the old and the new vector), in either order."""
    for action in actions:
        if "remove" in action:
            state.files.pop(action["remove"]["path"], None)
            state.sizes.pop(action["remove"]["path"], None)
            state.deleted.pop(action["remove"]["path"], None)
    for action in actions:
        if "txn" in action:
            state.txns[action["txn"]["appId"]] = action["txn"]["version"]
        elif "add" in action:
            state._add(action["add"])
        elif "metaData" in action:
            state.configuration = dict(action["metaData"].get("configuration") or {})


def row_bytes(table_path: str, state: LogState, sample: int = 2) -> int:
    """About the widest row group's uncompressed bytes per row, from the Parquet footers of the
    ``sample`` files with the most stored bytes per row (0: no files).  Sizes Spark's reads of
    the table, which hold a batch of rows of every column at once."""
    ranked = sorted((size / max(1, state.files.get(path) or 1), path) for path, size in state.sizes.items())
    fs, local = filesystem(table_path)
    widest = 0
    for _, path in ranked[-sample:]:
        if path.startswith("file:"):
            file = unquote(urlparse(path).path)
        elif "://" in path:
            continue  # an absolute path elsewhere (shallow clone): not worth a second filesystem
        else:
            file = f"{local}/{unquote(path)}"
        meta = pq.read_metadata(file, filesystem=fs)
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            if group.num_rows:
                widest = max(widest, -(-group.total_byte_size // group.num_rows))
    return widest


def _actions(fs: pafs.FileSystem, path: str) -> list[dict[str, Any]]:
    with fs.open_input_stream(path) as f:
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


def last_commit_info(table_path: str) -> dict[str, Any] | None:
    """The ``commitInfo`` of the newest commit, or None if there is no table."""
    fs, local = filesystem(table_path)
    log_dir = f"{local}/_delta_log"
    commits = sorted(int(m.group(1)) for n in _listing(fs, log_dir) if (m := _COMMIT.match(n)))
    if not commits:
        return None
    for action in _actions(fs, f"{log_dir}/{commits[-1]:020d}.json"):
        if "commitInfo" in action:
            return dict(action["commitInfo"])
    return None


def has_applied(table_path: str, app_id: str, version: int = 1) -> bool:
    return replay(table_path).has_applied(app_id, version)


class StaleFence(RuntimeError):
    """A newer lease holder (higher fencing token) already committed to the table."""


def newest_fence(table_path: str, partition: str | None = None) -> int | None:
    """The fencing token of the newest airflow-cdc commit of the table by ``partition`` (None:
    none recorded).  Partitions of one connector hold leases of their own, so only the same
    partition's tokens compare.

    Walks the JSON commits from the newest down to the first one airflow-cdc wrote (maintenance
    commits such as OPTIMIZE carry no token); commits older than the newest checkpoint are gone
    from view, which is fine: a token only matters while it is the newest.
    """
    fs, local = filesystem(table_path)
    log_dir = f"{local}/_delta_log"
    commits = sorted(
        (int(m.group(1)) for n in _listing(fs, log_dir) if (m := _COMMIT.match(n))), reverse=True
    )
    for version in commits:
        for action in _actions(fs, f"{log_dir}/{version:020d}.json"):
            meta = (action.get("commitInfo") or {}).get("userMetadata")
            if not meta:
                continue
            try:
                ours = json.loads(meta).get("airflow_cdc") or {}
            except (ValueError, AttributeError):
                continue
            if "fence" in ours and ours.get("partition") == partition:
                return int(ours["fence"])
    return None


def check_fence(table_path: str, fence: int | None, partition: str | None = None) -> None:
    """Refuse to write ``table_path`` when a newer lease holder already did.

    :param fence: this run's fencing token; ``None`` (no lease) skips the check.
    :param partition: the partition of a partitioned connector whose lease issued ``fence``.
    :raises StaleFence: the table's newest airflow-cdc commit carries a higher token.
    """
    if fence is None:
        return
    seen = newest_fence(table_path, partition)
    if seen is not None and seen > fence:
        raise StaleFence(
            f"{table_path} was written under lease token {seen}, newer than this run's {fence}: "
            "a newer run of the connector took over"
        )
