"""A team's Pydantic AI agent (`agent.py`, plain Pydantic AI) and the one module that brings it
to liyagent (`durable_desk.py`: the kind of each tool, nothing else)."""
