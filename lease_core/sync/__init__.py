"""Shard sync: the lease planner over a shard listing, its coordinator, the audits and the round's sync step."""
