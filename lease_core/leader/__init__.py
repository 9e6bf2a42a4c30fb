"""The round's leader: the leader lock, leadership for a step, the assignment round and the round history."""
