"""Polling: a shard read with GetShardIterator and GetRecords, paced to the limits it shares with its other readers."""
