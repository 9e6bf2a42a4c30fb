"""A batch whose rows fail as a whole says so as a `TransformError`, misfits or not."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import Decoder
from spark_jobs.errors import TransformError

ROWS = {b"1": {"a": 1}, b"2": {"a": "x"}, b"3": {"a": object()}}


def test_rows_that_conflict_beside_a_row_that_fits_nowhere_fail_the_batch_as_a_transform_error():
    """Without a schema: row 3 fits no table (a misfit, set aside), and rows 1 and 2 fit alone but not
    together (their inferred types conflict). The batch fails wholesale: `decode_batch` says so with
    a `TransformError` (what the lease report names as not retryable, and the replay reports as still
    failing), not with pyarrow's own ArrowInvalid escaping from the second build."""
    decoder = Decoder("users.rows:decode", lambda data, record: ROWS[data], None)
    records = [KinesisRecord(str(n), 0, "k", datetime(2026, 11, 26, tzinfo=UTC), str(n).encode()) for n in (1, 2, 3)]

    with pytest.raises(TransformError, match="do not fit one table"):
        decoder.decode_batch(records, "stream", "shardId-000000000000")
