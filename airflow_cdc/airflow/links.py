"""Operator extra links: the staged batch of a capture, the Delta tables an apply wrote.

Airflow 3's API server shows the URL a task stored under the link's XCom key while it ran (it
cannot run provider code for that), so the operators push it; ``get_link`` reads it back for
callers that ask the link object.  Local paths become ``file://`` URLs; object-store URIs
(``s3a://``, ``abfss://``, ...) are shown as they are.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom


def storage_url(path: str) -> str:
    """A URL for a staging or Delta location: ``file://`` + absolute path, or the URI itself."""
    parts = urlsplit(path)
    if parts.scheme and len(parts.scheme) > 1:
        return path
    return "file://" + quote(os.path.abspath(path))


class _StoredLink(BaseOperatorLink):
    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        value = XCom.get_value(ti_key=ti_key, key=self.xcom_key)
        return str(value) if value else ""

    def persist(self, context: Any, url: str) -> None:
        """Store ``url`` for the UI (no-op outside a task run)."""
        ti = context.get("ti") if hasattr(context, "get") else None
        if ti is not None:
            ti.xcom_push(key=self.xcom_key, value=url)


class CdcBatchLink(_StoredLink):
    """The staged batch directory (manifest + Parquet parts) a capture wrote or an apply read."""

    name = "CDC batch"


class CdcDeltaLink(_StoredLink):
    """The Delta root an apply wrote (``<root>/<layer>/<connector>/<table>``)."""

    name = "Delta tables"
