"""The results pages: a person reads gates, cases and runs in a browser (server-rendered)."""
