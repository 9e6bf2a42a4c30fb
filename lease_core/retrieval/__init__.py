"""Reading Kinesis: the shard listing, and shards' records through one seam (`record_source`), with
what every way of reading shares beside it and each way in a package of its own (`polling/`)."""
