"""Projects and bearer tokens: who may call which route, and over whose data."""
