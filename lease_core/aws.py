"""boto3 clients and the translation of AWS failures into lease_core errors.

Endpoints are never hard-coded: a configured `aws_endpoint_url_<service>` wins, otherwise boto3's
own resolution applies (`AWS_ENDPOINT_URL_<SERVICE>`, `AWS_ENDPOINT_URL`, then AWS).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from lease_core.config.settings import ConsumerConfig
from lease_core.errors import AccessError, DependencyError, TableNotFoundError, ThrottledError
from lease_core.retry import RetryPolicy

T = TypeVar("T")

THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "TooManyRequestsException",
        "SlowDown",
    }
)
# TransactionInProgressException: a transaction retried with its ClientRequestToken while its first
# try is still being applied; AWS says to retry it.
TRANSIENT_CODES = frozenset(
    {"InternalServerError", "InternalFailure", "ServiceUnavailable", "InternalError", "TransactionInProgressException"}
)
TRANSPORT_ERRORS = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ProxyConnectionError,
)


def error_code(error: BaseException) -> str | None:
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code")
        return None if code is None else str(code)
    return None


def is_retryable(error: Exception) -> bool:
    if isinstance(error, TRANSPORT_ERRORS):
        return True
    code = error_code(error)
    if code is None:
        return False
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)  # type: ignore[attr-defined]
    return code in THROTTLING_CODES or code in TRANSIENT_CODES or status >= 500


def may_have_been_applied(error: Exception) -> bool:
    """Whether a failed request may still have been carried out: its answer was lost or it failed
    server-side. Never for a request that was refused (throttled, invalid) or never sent."""
    if isinstance(error, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)):
        return False
    if isinstance(error, TRANSPORT_ERRORS):
        return True
    code = error_code(error)
    return code is not None and code not in THROTTLING_CODES and is_retryable(error)


def retry_policy(config: ConsumerConfig) -> RetryPolicy:
    return RetryPolicy(
        attempts=config.dependency_retry_attempts,
        base_millis=config.dependency_retry_base_millis,
        max_millis=config.dependency_retry_max_millis,
    )


_SESSION_LOCK = threading.Lock()


@functools.cache
def _shared_session() -> boto3.Session:
    """One default session per process: creating one costs 50-200 ms (measured), a slot needs three clients."""
    return boto3.Session()


def client(service: str, config: ConsumerConfig, session: boto3.Session | None = None) -> Any:
    """A boto3 client whose retries are ours (botocore's own retrying is switched off)."""
    endpoint = getattr(config, f"aws_endpoint_url_{service}", None)
    botocore_config = botocore.config.Config(
        # `total_max_attempts`: botocore reads `max_attempts` here as retries after the first request.
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=10,
        read_timeout=60,
        max_pool_connections=64,
    )
    # Sessions are not thread-safe: clients are created from them one at a time.
    with _SESSION_LOCK:
        session = session or _shared_session()
        return session.client(service, region_name=config.aws_region, endpoint_url=endpoint, config=botocore_config)


class AwsCaller:
    """Calls one service with the retry policy and turns failures into lease_core errors."""

    def __init__(self, service: str, policy: RetryPolicy) -> None:
        self.service = service
        self.policy = policy

    def call(self, operation: str, function: Callable[[], T], table_name: str | None = None) -> T:
        attempts = 0

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            return function()

        try:
            return self.policy.call(attempt, is_retryable)
        except botocore.exceptions.ClientError as error:
            raise self._translate(operation, error, attempts, table_name) from error
        except TRANSPORT_ERRORS as error:
            raise DependencyError(self.service, operation, str(error), attempts) from error

    def _translate(
        self, operation: str, error: botocore.exceptions.ClientError, attempts: int, table_name: str | None
    ) -> Exception:
        code = error_code(error) or "Unknown"
        message = error.response.get("Error", {}).get("Message", "")
        detail = f"{code}: {message}" if message else code
        if code == "ResourceNotFoundException" and table_name is not None:
            return TableNotFoundError(table_name)
        if code in THROTTLING_CODES:
            return ThrottledError(self.service, operation, detail, attempts)
        if is_retryable(error):
            return DependencyError(self.service, operation, detail, attempts)
        return AccessError(self.service, operation, detail)
