"""Connic-compatible test-run routes over gates, for the unmodified `connic test` CLI.

Owns no state: ``service`` maps Connic's vocabulary onto gates and runs (gates.submission,
gates.service); ``routes`` is its HTTP side. Never imports the worker.
"""
