"""Project secrets: stored encrypted, passed to case containers by name, redacted from results."""
