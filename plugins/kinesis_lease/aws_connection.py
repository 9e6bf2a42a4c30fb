"""From an Airflow AWS connection to what lease_core needs: a boto3 session and a configuration.

The connection (`aws_default` unless a task says otherwise) is read through the Amazon provider's
`AwsBaseHook`, so every credential source the provider supports works (keys, profiles, assumed
roles, the environment). Its endpoints (`endpoint_url` in the extra, or per service under
`service_config`) fill the configuration's `aws_endpoint_url_*` keys unless the settings set them,
and its region fills `aws_region`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig, load_config

SERVICES = ("dynamodb", "kinesis", "s3", "cloudwatch")


@dataclass(frozen=True)
class AwsAccess:
    session: boto3.Session
    config: ConsumerConfig

    @functools.cached_property
    def app(self) -> LeaseApplication:
        """The application's parts, built on the connection's session (`lease_core.application`)."""
        return LeaseApplication.from_config(self.config, self.session)

    def client(self, service: str) -> Any:
        return self.app.client(service)

    def spark_env(self) -> dict[str, str]:
        """Environment for spark-submit: the connection's credentials and region.

        The driver hands them on to the executors (`spark.executorEnv.*`, see the consume job), so
        they reach executors that a cluster's workers start. Only credentials the connection resolved
        to are passed; without them driver and executors use their own chain (an instance profile,
        say). Endpoints travel in the configuration instead.
        """
        env: dict[str, str] = {}
        credentials = self.session.get_credentials()
        if credentials is not None:
            frozen = credentials.get_frozen_credentials()
            env["AWS_ACCESS_KEY_ID"] = frozen.access_key
            env["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key
            if frozen.token:
                env["AWS_SESSION_TOKEN"] = frozen.token
        if self.config.aws_region:
            env["AWS_DEFAULT_REGION"] = self.config.aws_region
        return env


def aws_access(aws_conn_id: str | None, settings: Mapping[str, object]) -> AwsAccess:
    """The session of `aws_conn_id` and the configuration `settings` describe, completed by the connection."""
    hook = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="dynamodb")
    connection = hook.conn_config
    overrides = dict(settings)
    for service in SERVICES:
        key = f"aws_endpoint_url_{service}"
        endpoint = connection.get_service_endpoint_url(service) if connection else None
        if overrides.get(key) is None and endpoint:
            overrides[key] = endpoint
    if overrides.get("aws_region") is None and connection and connection.region_name:
        overrides["aws_region"] = connection.region_name
    config = load_config(environ=os.environ, overrides=overrides)
    return AwsAccess(hook.get_session(region_name=config.aws_region), config)
