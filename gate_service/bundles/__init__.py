"""Bundles: reading an uploaded archive safely, validating its suites and its requirements.

Owns ``archive`` (the safe walk of a .tar.gz or .zip, sizes from decompressed bytes),
``suites`` (the format's schema, agents, expressions; no user code runs) and
``requirements`` (PEP 508 data, never pip options). Imports errors, config and the runner's
expression checker; no database, no HTTP, no worker.
"""
