"""Everything that leaves a worker over HTTP: the send guard that stops a request of an attempt
that lost its lease, the SDK adapters, a tool call's client and what it saw."""
