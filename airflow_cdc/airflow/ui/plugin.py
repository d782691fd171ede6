"""The Airflow plugin (entry point ``airflow.plugins``): the CDC panel's app and where the UI shows it.

* ``fastapi_apps``: :mod:`.app` mounted by the api-server under ``/cdc`` (imported only there: the
  other components load plugins too, and need neither FastAPI nor the api-server's security);
* ``external_views`` (Airflow 3.1+): a *CDC* tab on every DAG page (``destination: dag``, an
  iframe of ``cdc/dags/{DAG_ID}``) and *CDC pipelines* under *Browse* (``destination: nav``).

Hrefs are relative (no leading slash): the UI resolves them against its base URL, so they keep
working under a ``[api] base_url`` with a path.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.plugins_manager import AirflowPlugin

URL_PREFIX = "/cdc"
EXTERNAL_VIEWS: list[dict[str, Any]] = [
    {"name": "CDC", "href": "cdc/dags/{DAG_ID}", "destination": "dag", "url_route": "cdc-dag"},
    {
        "name": "CDC pipelines",
        "href": "cdc/",
        "destination": "nav",
        "category": "browse",
        "url_route": "cdc",
    },
]


class CdcUiPlugin(AirflowPlugin):
    """Each pipeline's lag, retained source log, staged batches and snapshot progress in the UI."""

    name = "airflow_cdc"
    external_views = EXTERNAL_VIEWS

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from airflow_cdc.airflow.ui.app import app

        return [{"app": app, "url_prefix": URL_PREFIX, "name": "airflow-cdc pipelines"}]
