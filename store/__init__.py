"""All SQL lives here: schema, migrations and the statements the engine runs."""
