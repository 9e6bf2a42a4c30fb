"""The tables and their formats: the lease item codec, the conditional writes as data, the lease store
protocol with its DynamoDB and in-memory stores, coordinator state, and table administration."""
