"""What a run is as Postgres keeps it: its state, the sealed chain of its steps, its call keys, its
gates and its workflow spec."""
