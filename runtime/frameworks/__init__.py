"""Framework adapters: a team's Pydantic AI or OpenAI Agents SDK agent run on liyagent's own
loop, one module per framework, each a `GuestAgent` (`runtime/toolbox/guests.py`)."""
