"""An order-support desk built on liyagent: tools that call the desk's HTTP service, and an
agent that looks orders up, refunds, notes and emails customers."""
