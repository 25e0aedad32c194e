"""Gates: a submitted bundle's lifecycle from queued to its verdict, and how it is read.

Split by client. ``lifecycle`` holds every write of a gate's and its cases' state (creation
with its job, cancellation, the worker's state changes, each case's mark and outcome, the
verdict) and is the worker's only way in. ``views`` holds every read: the routes, the pages
(``gate_service.ui``) and the Connic routes read gates only through it. ``submission`` (the
Upload value, ``submit_bundle``, the API's cancel) is the API's way into the lifecycle.
Beside them: ``model_calls`` (a case's model calls, stored by the lifecycle, summed and
exported by the views), ``labels``, ``schemas``, ``notify`` (the API's LISTEN and the
long-poll that waits on it) and ``status_reads`` (the status fast path's connections and
queries). ``routes`` and ``upload`` are its HTTP side. Import-linter contracts keep the
worker off ``views`` and the HTTP modules off ``lifecycle``.

Imports the queue (jobs), admission, bundles, the runner's result contract
(``gate_runner.contract``, ``runner_contract``), stored_runs, the gateway's call records,
auth (principals, scopes and the audit; its dependencies in the routes), listen, and the
root's plumbing (config, db, errors, models, links, text; app_state and deps in the
routes); never the worker.
"""
