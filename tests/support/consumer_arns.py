"""A `ConsumerArns` for reader tests on the Kinesis stand-in alone: the consumer of each stream
looked up by name (DescribeStreamSummary, DescribeStreamConsumer), again when a reader says Kinesis
no longer finds the ARN it had. The application's own (`StreamConsumers`) also proves the consumer
is its own against its coordinator-state record, which needs DynamoDB; a reader does not care."""

from __future__ import annotations

import threading
from typing import Any

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.errors import StreamConsumerError, StreamConsumerNotReadyError, StreamNotFoundError
from lease_core.retry import RetryPolicy


class DescribedConsumerArns:
    """`ConsumerArns` by DescribeStreamSummary (the stream's ARN) and DescribeStreamConsumer."""

    def __init__(self, kinesis: Any, consumer_name: str, retry_policy: RetryPolicy = RetryPolicy()) -> None:
        self._kinesis = kinesis
        self._consumer_name = consumer_name
        self._caller = AwsCaller("kinesis", retry_policy)
        self._lock = threading.Lock()
        self._arns: dict[str, str] = {}

    def arn(self, stream_name: str) -> str:
        with self._lock:
            known = self._arns.get(stream_name)
        if known is not None:
            return known
        described = self._describe(stream_name)
        with self._lock:
            return self._arns.setdefault(stream_name, described)

    def refresh(self, stream_name: str, stale_arn: str) -> str:
        with self._lock:
            if self._arns.get(stream_name) == stale_arn:
                del self._arns[stream_name]
        return self.arn(stream_name)

    def _describe(self, stream_name: str) -> str:
        def stream_arn() -> str:
            try:
                summary = self._kinesis.describe_stream_summary(StreamName=stream_name)
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    raise StreamNotFoundError(stream_name) from error
                raise
            return str(summary["StreamDescriptionSummary"]["StreamARN"])

        def consumer() -> dict[str, Any]:
            try:
                described: dict[str, Any] = self._kinesis.describe_stream_consumer(
                    StreamARN=stream, ConsumerName=self._consumer_name
                )["ConsumerDescription"]
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    raise StreamConsumerError(
                        stream_name,
                        self._consumer_name,
                        "is not registered: the DAG's table step or `leasectl init` registers it (retrieval = fan_out)",
                    ) from error
                raise
            return described

        stream = self._caller.call("DescribeStreamSummary", stream_arn)
        described = self._caller.call("DescribeStreamConsumer", consumer)
        status = described.get("ConsumerStatus")
        if status != "ACTIVE":
            raise StreamConsumerNotReadyError(stream_name, self._consumer_name, f"is {status}, not ACTIVE")
        return str(described["ConsumerARN"])
