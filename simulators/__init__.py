"""Vendor simulators: one loopback HTTP server that plays the external vendors the tools call.

Every request it receives is recorded in Postgres (schema ``sim``), so tests count duplicate
writes from the vendor's own records rather than from what the engine believes it sent.
"""
