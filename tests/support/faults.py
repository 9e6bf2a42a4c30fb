"""Fault-injecting wrappers around real boto3 clients (fakes, not mocks: every other call is real)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import botocore.exceptions


def client_error(
    code: str, operation: str, status: int = 400, message: str = "injected"
) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


class FaultInjectingClient:
    """Delegates to `client`, but lets `fault(method_name, call_number)` replace a call's outcome.

    `fault` returns an exception to raise, a value to return instead of calling, or None to pass
    the call through. `calls` counts calls per method.
    """

    def __init__(self, client: Any, fault: Callable[[str, int], Any]) -> None:
        self._client = client
        self._fault = fault
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return self._perform(name, self.calls[name], lambda: target(*args, **kwargs))

        return call

    def _perform(self, name: str, number: int, real_call: Callable[[], Any]) -> Any:
        outcome = self._fault(name, number)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome if outcome is not None else real_call()


class AnswerLostClient(FaultInjectingClient):
    """Delegates to `client`; the calls `lose(method_name, call_number)` picks are made for real, and
    then their answer is lost: the caller sees a dropped connection although the write landed."""

    def __init__(self, client: Any, lose: Callable[[str, int], bool]) -> None:
        super().__init__(client, lambda name, number: None)
        self._lose = lose

    def _perform(self, name: str, number: int, real_call: Callable[[], Any]) -> Any:
        answer = real_call()
        if self._lose(name, number):
            raise botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1/answer-lost")
        return answer


class InterleavingClient:
    """Delegates to `client`, and runs `interleave` once, just before the first call that `at(method_name,
    arguments, earlier_calls)` picks: another process's steps, deterministically between two of this one's."""

    def __init__(
        self,
        client: Any,
        at: Callable[[str, dict[str, Any], list[tuple[str, dict[str, Any]]]], bool],
        interleave: Callable[[], Any],
    ) -> None:
        self._client = client
        self._at = at
        self._interleave: Callable[[], Any] | None = interleave
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, name)
        if not callable(target):
            return target

        def call(**arguments: Any) -> Any:
            if self._interleave is not None and self._at(name, arguments, self.calls):
                interleave, self._interleave = self._interleave, None
                interleave()
            self.calls.append((name, arguments))
            return target(**arguments)

        return call
