"""What Airflow's ProvidersManager knows of this package: the `apache_airflow_provider` entry point.

Airflow 3 validates the dictionary against its provider_info.schema.json and requires `package-name`
to be the installed distribution's name. The monitoring UI's plugin is deliberately not listed under
`plugins`: Airflow loads it from the `airflow.plugins` entry point in every configuration, and when
providers are discovered eagerly (`[core] lazy_discover_providers = False`) it would load a listed
plugin a second time, skip it by name and report "Plugin 'kinesis_lease' already registered" as a
plugin import error (Airflow 3.3.2, measured).
"""

from __future__ import annotations

from importlib.metadata import metadata
from typing import Any

DISTRIBUTION = "kinesis-lease-batch"
INTEGRATION = "Amazon Kinesis Data Streams"


def get_provider_info() -> dict[str, Any]:
    """Kept free of Airflow imports: every Airflow process that lists providers calls it."""
    installed = metadata(DISTRIBUTION)
    return {
        "package-name": DISTRIBUTION,
        "name": "Kinesis Lease Batch",
        "description": installed["Summary"],
        "versions": [installed["Version"]],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://docs.aws.amazon.com/streams/latest/dev/shared-throughput-kcl-consumers.html",
                "tags": ["aws"],
            }
        ],
        "operators": [{"integration-name": INTEGRATION, "python-modules": ["kinesis_lease.operators"]}],
    }
