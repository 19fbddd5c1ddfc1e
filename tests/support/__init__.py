"""Helpers the test tiers share: real processes, private servers, per-test stacks."""
