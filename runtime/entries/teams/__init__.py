"""Teams through the Bot Framework, the whole entry kind in one package:

- `inbox.py`: who sent a turn (the Entra object id that owns its run), the durable inbox and
  its intake;
- `reply.py`: the entry point (`ENTRY`, registered in pyproject.toml's `liyagent.entries`) and
  the reply, posted once;
- `connector.py`: the bot's token, the requests that carry it, reads tried again;
- `graph.py`: reading a reply back through Microsoft Graph; `ids.py`: the Graph ids a message
  activity lacks, asked of Microsoft and kept.

Its HTTP route is `front/teams.py`.
"""
