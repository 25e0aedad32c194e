"""Bearer tokens and sign-in: who is calling, over which project's data, and the audit trail.

Owns the tokens and audit tables' rules: ``service`` (authenticate, scopes, which projects a
caller sees, audit rows), ``tokens`` (making and hashing tokens), ``brakes`` (failure
limiter, audit budget). ``deps`` (the bearer dependency and the admin routes' error
answers) and ``routes`` (tokens, the audit trail) are its HTTP side. Imports models,
errors and text; its HTTP side also db, deps and app_state. Never projects, the worker, the
command line or the app. Projects themselves and their settings are projects/'s.
"""
