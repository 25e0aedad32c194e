"""Projects and their configuration: what a project is and how its gates run.

Owns the projects table's rows and settings: ``service`` (creation with the `default`
project's bootstrap, retention, model routes, egress hosts, the guardrail model, API specs:
each write with its audit event; and ``settings_of``, what the worker reads of them),
``deletion`` (a project with everything of it, in one transaction) and ``schemas``.
``routes`` is its HTTP side. Imports auth (who may see a project, the audit trail, issuing
the bootstrap token), api_specs (OpenAPI documents as tools), gateway (``ModelRoute``),
endpoints, errors, models, text and the runner's name rules (gate_runner.case_env); its
HTTP side also deps. Never the worker, the command line or the app.
"""
