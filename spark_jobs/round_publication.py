"""The round's last step on the driver: every committed batch the readers cannot see yet made visible.

A sink that makes batches visible one by one (the Parquet dataset) has done it in the slots; this
step only finishes what a slot left (its promotion was cut short). A sink that publishes a round
at once (an Iceberg table) makes its one commit here, for every batch the lease table says is
committed and the table does not hold yet: this round's, and any earlier round's whose driver died
before its commit. The records come from a scan of the lease table taken after the slots ended, so
a slot's commit is either in it or published by the next round; publishing twice is harmless
(`BatchSink.publish_round` skips what is visible).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from lease_core.application import LeaseApplication
from lease_core.errors import LeaseCoreError
from lease_core.model.lease import Lease
from sinks.batch_sink import BatchSink, RoundIdentity
from spark_jobs.round_report import Publication

log = logging.getLogger(__name__)


def publish_committed_batches(
    sink: BatchSink, identity: RoundIdentity, leases: Sequence[Lease]
) -> tuple[Publication, tuple[str, ...]]:
    """The round's publication and the committed batches it found gone ("lease key: batch")."""
    records = {lease.lease_key: lease.committed_batch for lease in leases if lease.committed_batch}
    identity = replace(identity, checkpoints={lease.lease_key: lease.checkpoint for lease in leases})
    try:
        published = sink.publish_round(records, identity)
    except Exception as error:  # a sink's own failure, or a library's it did not expect: the round says it
        log.error("the round's committed batches could not be made visible in %s: %s", sink.uri, error)
        return Publication.failed(
            str(error) if isinstance(error, LeaseCoreError) else f"{type(error).__name__}: {error}"
        ), ()
    publication = Publication(
        published.commits, published.batches_published, published.batches_already_visible, published.snapshot_id
    )
    return publication, published.missing_batches


def stream_incarnations(app: LeaseApplication, streams: Sequence[str]) -> dict[str, tuple[str, int]]:
    """Each stream's ARN and creation time (epoch seconds), so that a stream deleted and created again
    under its name is told apart. A stream that cannot be described now is left out: neither the
    round nor its publication must fail for it (the sink then cannot tell its incarnations apart)."""
    incarnations = {}
    for stream in streams:
        try:
            description = app.shard_source.describe_stream(stream)
        except LeaseCoreError as error:
            log.warning("stream %r could not be described for the round's publication: %s", stream, error)
            continue
        incarnations[stream] = (description.stream_arn, description.creation_epoch_millis // 1000)
    return incarnations
