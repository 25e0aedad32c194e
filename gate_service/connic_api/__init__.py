"""Connic-compatible test-run routes over gates, for the unmodified `connic test` CLI.

Owns no state: ``service`` maps Connic's vocabulary onto gates and runs (gates.submission,
gates.schemas); ``routes`` is its HTTP side, creating gates through gates.submission and
reading them through gates.views. Never imports the worker or gates.lifecycle.
"""
