"""A lease's life after shard sync: holding it (claim, renew, checkpoint), parents before children,
child creation at SHARD_END, waiting for other slots' parents, and cleanup."""
