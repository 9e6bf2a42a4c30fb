"""Enhanced fan-out: reading shards by SubscribeToShard through the application's registered stream consumer."""
