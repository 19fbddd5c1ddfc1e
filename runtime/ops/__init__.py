"""Operator work: reading a run, metrics, ad hoc tool calls, retention, erasure and the checks a
process passes before it takes work."""
