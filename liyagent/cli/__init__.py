"""The `liyagent` command: operators' and developers' entry to the engine."""
