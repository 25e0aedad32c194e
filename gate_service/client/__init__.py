"""A typed client of the gate's REST API, used by `gate submit` and by pipelines.

Owns packing a project as the format's CLI does, the HTTP client, the answers it reads as
typed models (``shapes``), terminal output and JUnit. Talks to the service over HTTP only: of
the service it imports ``gate_service.results`` alone, the leaf that builds a result's shapes
from the runner's contract (an import-linter contract).
"""
