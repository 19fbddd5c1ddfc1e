"""Tools: what a tool declares, typed Python tools, MCP servers' tools, and where a deployment's
tools load from."""
