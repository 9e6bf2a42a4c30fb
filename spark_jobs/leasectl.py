"""The installed `leasectl`: lease_core's commands (`lease_core.ops.cli`), with `verify` and `restore`
reading the application's sink, which lives here, above lease_core."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lease_core.config.settings import ConsumerConfig
from lease_core.errors import ConfigurationError
from lease_core.ops.cli import main as lease_main
from lease_core.ops.landed_audit import LandedRecords
from spark_jobs.errors import SinkError
from spark_jobs.sinks import open_sink


def open_landed(output_uri: str, config: ConsumerConfig) -> LandedRecords:
    """The sink at `output_uri`, if it records what landed; `ConfigurationError` naming the option otherwise."""
    try:
        sink = open_sink(output_uri, config=config)
    except SinkError as error:
        raise ConfigurationError("output_uri", error.problem) from None
    if not isinstance(sink, LandedRecords):
        raise ConfigurationError(
            "output_uri", f"{output_uri!r} is a Parquet dataset, which does not record what landed; only table sinks do"
        )
    return sink


def main(argv: Sequence[str] | None = None) -> int:
    return lease_main(argv, open_landed=open_landed)


def console_main() -> None:
    sys.exit(main())
