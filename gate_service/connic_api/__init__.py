"""Connic-compatible test-run routes over gates, for the unmodified `connic test` CLI."""
