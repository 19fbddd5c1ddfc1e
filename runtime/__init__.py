"""The engine: agent loop, checkpoints, sealing, leases, sweeper, settlement, keys, tools."""
