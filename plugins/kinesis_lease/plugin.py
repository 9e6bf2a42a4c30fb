"""The Airflow plugin of kinesis-lease-batch: the lease monitoring UI in the Airflow API server.

It mounts `kinesis_lease.ui_app` (which authenticates every route itself, see there) and adds two
views to the Airflow UI: a navigation entry showing one application, and a tab on every DAG run
showing the application that run consumed as. The operators are not registered here: DAGs import
them from `kinesis_lease.operators`.

Airflow loads it through the `airflow.plugins` entry point of the installed package (pyproject.toml),
never from a plugins folder: it lives inside the package, which plugins/.airflowignore hides from a
plugins folder scan, so a checkout whose plugins/ is also Airflow's plugins folder registers it once.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/kinesis-lease"
# Every pipeline's DAG carries this tag (`kinesis_lease.pipeline`): the monitoring page lists the
# deployment's applications from the DAGs that have it.
PIPELINE_TAG = "kinesis-lease"
# Relative hrefs: the Airflow UI resolves them against its <base href>, so they follow [api] base_url.
PAGE_HREF = URL_PREFIX.lstrip("/") + "/"


class KinesisLeasePlugin(AirflowPlugin):
    name = "kinesis_lease"
    external_views = [
        {
            "name": "Kinesis leases",
            "href": PAGE_HREF,
            "destination": "nav",
            "url_route": "kinesis-leases",
        },
        {
            "name": "Kinesis leases",
            "href": PAGE_HREF + "dag-runs/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "kinesis-leases-run",
        },
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]  # a property: imported lazily
        """Imported when asked for, which only the API server does: every task process loads the plugins,
        and importing the app (FastAPI, Airflow's core API security) costs them 1.5-2.5 s each (measured)."""
        from kinesis_lease.ui_app import app

        return [{"app": app, "url_prefix": URL_PREFIX, "name": "Kinesis lease monitoring"}]
