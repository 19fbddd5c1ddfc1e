"""Bring an agent a team already has: one module per framework (`pydantic_ai`,
`openai_agents`), each exporting `durable(agent, name=..., kinds={...})`, held at a tool
module's top level (`LIYAGENT_TOOLS`); `liyagent.start_agent(name, input)` then starts its
runs. How an adapter plugs in: `runtime/toolbox/guests.py`."""
