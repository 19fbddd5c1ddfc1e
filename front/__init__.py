"""The app process's HTTP front: webhooks, ticket events, co-pilot turns, A2A tasks, Teams
messages, approval decisions and run reads, each one authenticated call into the runtime."""
