"""Who holds which run: leases, the fence every write goes through (Redis scripts), worker presence
and the heartbeat that renews both."""
