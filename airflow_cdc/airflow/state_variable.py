"""A :class:`~airflow_cdc.core.state.StateStore` in Airflow Variables: one JSON Variable per connector.

Select it with ``state.store: airflow-variable://`` (optional ``?prefix=...``, default
``airflow_cdc_state.``): the state of connector ``shop`` is the Variable ``airflow_cdc_state.shop``::

    {"connector": "shop", "version": 7, "updated_at": "...", "token": "...", "state": {...}}

Limits (Airflow offers no atomic compare-and-set on Variables, nor a lock a task may take):
compare-and-set here is *check, write, re-read*: it refuses a commit whose expected version is not
the stored one, and detects a writer that overwrote it before the re-read.  Two commits that
interleave within one round trip to the API server can still both succeed (the later write wins).
The DAG factory's ``max_active_runs=1`` and the source's single-consumer slot make that unlikely;
where several writers can race, use the metastore-table backend (``postgresql://...?table=...``),
whose compare-and-set is a single conditional UPDATE.  Reads go through Airflow's secrets backends:
keep ``[secrets] use_cache`` off and never define these Variables in the environment
(``AIRFLOW_VAR_...``), which would shadow the stored value.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from airflow_cdc.core.errors import StateConflict
from airflow_cdc.core.state import (
    StateCorrupt,
    StoredState,
    check_connector,
    check_expected_version,
    decode_state,
    encode_state,
    register_state_store,
    utc_now_iso,
)

SCHEME = "airflow-variable"
DEFAULT_PREFIX = "airflow_cdc_state."


def _airflow_get(key: str) -> str | None:
    from airflow.sdk import Variable

    value = Variable.get(key, default=None)
    return None if value is None else str(value)


def _airflow_set(key: str, value: str) -> None:
    from airflow.sdk import Variable

    Variable.set(key, value, description="airflow-cdc connector state (offset, snapshot progress)")


def _airflow_delete(key: str) -> None:
    from airflow.sdk import Variable

    Variable.delete(key)


class VariableStateStore:
    """Connector states in Airflow Variables ``<prefix><connector>``.

    :param prefix: Variable key prefix.
    :param get: reads a Variable's text or ``None`` (default: ``airflow.sdk.Variable``; injectable
        for tests and other key-value stores).
    :param put: writes a Variable's text.
    :param delete: deletes a Variable.
    """

    def __init__(
        self,
        prefix: str = DEFAULT_PREFIX,
        *,
        get: Callable[[str], str | None] = _airflow_get,
        put: Callable[[str, str], None] = _airflow_set,
        delete: Callable[[str], None] = _airflow_delete,
    ) -> None:
        self.prefix = prefix
        self._get, self._put, self._delete = get, put, delete
        self._leases: VariableStateStore | None = None

    def lease_store(self) -> VariableStateStore:
        """The lease records: Variables ``<prefix without trailing dot>_lease.<connector>``."""
        if self._leases is None:
            self._leases = VariableStateStore(
                self.prefix.rstrip(".") + "_lease.", get=self._get, put=self._put, delete=self._delete
            )
        return self._leases

    @classmethod
    def from_url(cls, url: str) -> VariableStateStore:
        """Open ``airflow-variable://[?prefix=...]``."""
        query = dict(parse_qsl(urlsplit(url).query))
        return cls(query.get("prefix", DEFAULT_PREFIX))

    def key(self, connector: str) -> str:
        return self.prefix + check_connector(connector)

    def describe(self) -> str:
        return f"Airflow Variables {self.prefix}<connector>"

    def _record(self, connector: str) -> dict[str, Any] | None:
        text = self._get(self.key(connector))
        if text is None:
            return None
        try:
            record = decode_state(text, f"Variable {self.key(connector)}")
            if record.get("connector") != connector or not isinstance(record.get("version"), int):
                raise ValueError("connector name or version does not match")
            if not isinstance(record.get("state"), dict):
                raise ValueError("state is not a JSON object")
            return record
        except ValueError as e:
            raise StateCorrupt(f"Variable {self.key(connector)} is not a valid connector state: {e}") from e

    def load(self, connector: str) -> StoredState | None:
        record = self._record(connector)
        if record is None:
            return None
        return StoredState(record["version"], record["state"], str(record.get("updated_at", "")))

    def compare_and_set(self, connector: str, expected_version: int | None, data: dict[str, Any]) -> int:
        """Write ``data`` as version ``expected_version + 1`` if the stored version is ``expected_version``.

        :raises StateConflict: the stored version differs, or another writer overwrote ours before
            the re-read (see the module notes for what this cannot detect).
        """
        check_expected_version(expected_version)
        encode_state(data)
        current = self._record(connector)
        found = current["version"] if current else None
        if found != expected_version:
            raise StateConflict(
                f"state of connector {connector!r} in {self.describe()} is at version {found}, "
                f"expected {expected_version}"
            )
        token = uuid.uuid4().hex
        version = (found or 0) + 1
        record = {
            "connector": connector,
            "version": version,
            "updated_at": utc_now_iso(),
            "token": token,
            "state": data,
        }
        self._put(self.key(connector), json.dumps(record, sort_keys=True, allow_nan=False))
        after = self._record(connector)
        if after is None or after.get("token") != token:
            raise StateConflict(f"state of connector {connector!r} was overwritten by a concurrent commit")
        return version

    def delete(self, connector: str) -> None:
        if self._get(self.key(connector)) is not None:
            self._delete(self.key(connector))

    def __repr__(self) -> str:
        return f"VariableStateStore({self.prefix!r})"


register_state_store(SCHEME, VariableStateStore.from_url)
