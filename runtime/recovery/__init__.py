"""Taking runs back: the death watch (a worker gone), the sweeper (a lease lapsed, a run queued too
long) and riding out a store outage."""
