"""Enhanced fan-out: shards read with SubscribeToShard through the application's registered stream consumer."""
