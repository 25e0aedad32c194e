"""A typed client of the gate's REST API, used by `gate submit` and by pipelines."""
