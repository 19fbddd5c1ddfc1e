"""Entry points: how each kind of run starts and how its answer is handed on (cron, webhooks,
ticket events, co-pilot, A2A, Teams), and the client API."""
