"""Commit Delta log versions from this process: files already placed, and idempotency marks.

A Spark Connect client has no transaction API (``writes.commit_actions`` needs a JVM), so over
Connect a bronze table got its events re-encoded through a DataFrame write and each extra mark an
empty append: Spark jobs on the server that cost a warm server about a third of a small batch's
apply.  What those commits hold is simple enough to write here, as Delta's protocol
(``PROTOCOL.md``) lays down for a blind append:

* one file ``_delta_log/<version, 20 digits>.json`` of newline-delimited actions -- a
  ``commitInfo``, a ``txn`` per mark (``appId``, ``version``, ``lastUpdated``) and the ``add``
  actions -- created only if absent: on a local disk a temporary file hard-linked to its
  name (``link`` fails when the name exists, and readers never see a partial file; a filesystem
  without hard links leaves the commit to Spark); on S3, GCS
  and ADLS a conditional put (``If-None-Match: *`` and the like, ``core.storage``).  Losing the
  race for a version means another writer committed it: the log is read again, and the commit
  is either found done (its marks are there) or tried at the next version;
* only for tables whose protocol asks nothing more of a writer that adds files: writer features
  outside :data:`WRITER_FEATURES` (row tracking, in-commit timestamps, clustering, Iceberg
  compatibility, coordinated commits ...), CHECK constraints, generated or identity columns,
  column invariants and column mapping make :func:`refusal` name the reason, and the caller
  goes the Spark way;
* not the versions a Delta writer checkpoints (multiples of ``delta.checkpointInterval``, 10 by
  default): those the caller leaves to Spark, whose commit writes the checkpoint, so readers
  keep replaying at most an interval of JSON commits.

The marks and ``userMetadata`` (batch, offset, lease fence) are those Spark's commits carry, so
``delta_log.has_applied``, ``newest_fence`` and ``commit`` read them alike.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from . import delta_log

#: writer features whose only duties toward a commit of new files (no removes, no metadata
#: change, files without deletion vectors) are met by such a commit; the duties of the four
#: column-value features arise only from table properties or column metadata, checked below
WRITER_FEATURES = {
    "appendOnly",
    "changeDataFeed",
    "checkConstraints",
    "generatedColumns",
    "identityColumns",
    "invariants",
    "columnMapping",  # with mode none only (checked below)
    "deletionVectors",
    "domainMetadata",
    "timestampNtz",
    "typeWidening",
    "typeWidening-preview",
    "v2Checkpoint",
    "vacuumProtocolCheck",
}
#: column metadata that obliges a writer to compute or check values
_COLUMN_DUTIES = ("delta.generationExpression", "delta.identity.start", "delta.invariants")
#: tries of one commit when other writers keep taking the version it reads
ATTEMPTS = 10


def refusal(state: delta_log.LogState, adding: bool = True) -> str | None:
    """Why this process may not commit files and marks (``adding``; else marks alone) to the
    table of ``state`` (None: it may).  Column mapping and the duties toward column values
    concern files only."""
    if state.version < 0 or state.schema_string is None:
        return "no table yet"
    protocol = state.protocol
    writer = int(protocol.get("minWriterVersion") or 0)
    if writer >= 7:
        unknown = sorted(set(protocol.get("writerFeatures") or []) - WRITER_FEATURES)
        if unknown:
            return f"writer features {', '.join(unknown)}"
    elif writer > 5:
        return f"writer version {writer}"
    config = state.configuration
    if config.get("delta.enableInCommitTimestamps") == "true":
        return "delta.enableInCommitTimestamps"
    if not adding:
        return None
    if config.get("delta.columnMapping.mode", "none") != "none":
        return "column mapping"
    for key, value in config.items():
        if key.startswith("delta.constraints."):
            return "CHECK constraints"
        if key == "delta.enableRowTracking" and value == "true":
            return key
    if _column_duties(json.loads(state.schema_string)):
        return "generated, identity or invariant columns"
    return None


def _column_duties(data_type: Any) -> bool:
    if not isinstance(data_type, dict):
        return False
    for f in data_type.get("fields") or []:
        if any(k in (f.get("metadata") or {}) for k in _COLUMN_DUTIES) or _column_duties(f.get("type")):
            return True
    for key in ("elementType", "keyType", "valueType"):
        if _column_duties(data_type.get(key)):
            return True
    return False


def checkpoint_due(state: delta_log.LogState) -> bool:
    """Whether the table's next version is one a Delta writer checkpoints."""
    interval = int(state.configuration.get("delta.checkpointInterval") or 10)
    return (state.version + 1) % max(1, interval) == 0


def commit(
    table_path: str,
    adds: list[dict[str, Any]],
    marks: list[tuple[str, int]],
    metadata: str,
    state: delta_log.LogState | None = None,
) -> bool | None:
    """Commit ``adds`` (Delta ``add`` actions of files already in the table's directory) with
    the marks (``(appId, version)``) the table lacks, as one Delta version.

    Returns True when committed, False when the table has every mark already (nothing written;
    ``adds`` are left unreferenced -- a re-run places files under the same names), and None when
    this process may not commit to this table (:func:`refusal`) or the version is one Spark
    should write (:func:`checkpoint_due`): nothing written, the caller takes the Spark way.
    """
    for _ in range(ATTEMPTS):
        state = state if state is not None else delta_log.replay(table_path)
        missing = [(app, v) for app, v in marks if not state.has_applied(app, v)]
        if not missing:
            return False
        if refusal(state, bool(adds)) is not None or checkpoint_due(state) or not _can_create(table_path):
            return None
        version = state.version + 1
        lines = [_commit_info(adds, metadata, state)]
        lines += [{"txn": {"appId": app, "version": v, "lastUpdated": _now()}} for app, v in missing]
        lines += adds
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        try:
            _create(table_path, f"_delta_log/{version:020d}.json", data)
            return True
        except FileExistsError:
            state = None  # another writer took the version: read the log again
        except _NoAtomicCreate:
            return None
    raise RuntimeError(f"{table_path}: other writers took {ATTEMPTS} versions in a row; run the batch again")


def _commit_info(adds: list[dict[str, Any]], metadata: str, state: delta_log.LogState) -> dict[str, Any]:
    rows = sum(json.loads(a["add"].get("stats") or "{}").get("numRecords", 0) for a in adds)
    return {
        "commitInfo": {
            "timestamp": _now(),
            "operation": "WRITE",
            "operationParameters": {
                "mode": "Append",
                "partitionBy": json.dumps(state.partition_columns),
            },
            "readVersion": state.version,
            "isolationLevel": "Serializable",
            "isBlindAppend": True,
            "operationMetrics": {"numFiles": str(len(adds)), "numOutputRows": str(rows)},
            "userMetadata": metadata,
            "engineInfo": "airflow-cdc log_commit",
            "txnId": str(uuid.uuid4()),
        }
    }


def _can_create(table_path: str) -> bool:
    """Whether this process can create objects put-if-absent on the table's store (local disks
    always; object stores through ``airflow_cdc.core.storage``, which a Spark cluster that runs
    the job alone may lack)."""
    if _local(table_path):
        return True
    try:
        import airflow_cdc.core.storage  # noqa: F401
    except ImportError:
        return False
    return True


def _local(table_path: str) -> bool:
    return "://" not in table_path or table_path.startswith("file://")


def _now() -> int:
    return int(time.time() * 1000)


class _NoAtomicCreate(OSError):
    """The local filesystem cannot create a file put-if-absent and atomically (no hard links)."""


def _create(table_path: str, name: str, data: bytes) -> None:
    """Write ``name`` below the table only if absent, atomically (readers never see part of it).

    :raises FileExistsError: it exists.
    """
    fs, local = delta_log.filesystem(table_path)
    target = f"{local}/{name}"
    if _local(table_path):
        temp = f"{os.path.dirname(target)}/.{os.path.basename(target)}.{uuid.uuid4().hex}.tmp"
        with open(temp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temp, target)
        except FileExistsError:
            raise
        except OSError as e:  # a filesystem without hard links: Spark's rename-based store serves
            raise _NoAtomicCreate(str(e)) from e
        finally:
            os.unlink(temp)
        return
    from airflow_cdc.core.storage import open_location  # the client side only: has airflow_cdc

    (open_location(table_path) / name).create(data)
