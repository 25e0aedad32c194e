"""A typed client of the gate's REST API, used by `gate submit` and by pipelines.

Owns packing a project as the format's CLI does, the HTTP client, terminal output and JUnit.
Imports nothing of the service (it talks to it over HTTP only).
"""
