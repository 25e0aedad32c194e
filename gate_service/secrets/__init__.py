"""Project secrets: stored encrypted, passed to case invocations by name, redacted from results.

Owns the secrets table's rules (``service``: names, caps), encryption at rest (``crypto``)
and redaction (``redact``); ``routes`` is its HTTP side. Imports models, db, errors,
admission (the project lock) and the runner's name rules; never the worker.
"""
