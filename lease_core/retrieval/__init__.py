"""Reading Kinesis: the shard listing."""
