"""Projects and bearer tokens: who may call which route, and over whose data.

Owns the projects, tokens and audit tables' rules: ``service`` (authenticate, scopes, audit
rows), ``tokens`` (making and hashing tokens), ``brakes`` (failure limiter, audit budget),
``deletion`` (a project with everything of it, in one transaction).
``deps`` and ``routes`` are its HTTP side. Imports models, db, errors; never the worker.
"""
