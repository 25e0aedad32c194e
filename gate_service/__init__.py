"""The deploy gate service: REST API, job worker and Docker sandbox for agent-project bundles.

Layers, from the outside in (import-linter contracts in pyproject.toml hold them):
- entry points: ``cli`` (`gate ...`) and ``main`` (the FastAPI app); nothing imports them;
- HTTP code: the ``routes`` modules, ``deps``, ``middleware``, ``http_errors``, ``app_state``,
  ``metrics_route``, ``auth.deps``, ``gates.upload``; only entry points and other HTTP code
  import them;
- the worker (``worker``), which imports services, the queue and the sandbox port, no HTTP;
- services and their data: ``gates``, ``bundles``, ``secrets``, ``auth``, ``projects``,
  ``api_specs``, ``connic_api``, ``jobs`` (the queue both sides use), ``admission``,
  ``stored_runs``, ``sandbox`` (the port);
- foundations: ``models``, ``db``, ``config``, ``errors``, ``listen``, ``metrics``,
  ``incidents``, ``text``, ``resources``.
The runner (``gate_runner``) is a package of its own that never imports this one.
"""

__version__ = "0.1.0"
