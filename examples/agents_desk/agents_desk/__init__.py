"""A team's OpenAI Agents SDK agent (`agent.py`, plain Agents SDK) and the one module that
brings it to liyagent (`durable_desk.py`: the kind of each tool, nothing else)."""
