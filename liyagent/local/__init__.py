"""Local deployments for the demo, the kill trials and the tests: private servers and real
worker processes, each in its own process group."""
