"""The protocol's values: extended sequence numbers, the lease, shards, a prepared batch's description."""
