"""The durable engine: one attempt of a run (the agent loop, workflows, jobs), its calls and their
settlement, waits, and the one door that enqueues a run."""
