"""The deploy gate service: REST API, job worker and Docker sandbox for agent-project bundles."""

__version__ = "0.1.0"
