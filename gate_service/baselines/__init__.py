"""Baselines: a case's history across gates, and what a gate's verdict reads from it.

- ``stats``: the one-sided Fisher exact test, and the Wilson interval re-exported from
  ``gate_runner.sequential`` (whose Wilson verdict rule the runner runs).
- ``closure``: a case's identity (``case_key``) and closure hash, and whether an incremental
  gate may reuse its cases, worked out in validating from the bundle.
- ``spec``: a submission's ``baseline`` (a gate id or ``label:key=value``).
- ``judging``: the worker's part, in its own transactions: the baseline a gate names, the
  cases an incremental gate reuses, and each judged case's baseline comparison, flakiness
  and quarantine before the verdict (``gates.lifecycle.finish_gate`` reads them).
- ``figures``: a case's interval, ``narrow`` and ``regression`` beside its verdict.
- ``history``, ``quarantine``, ``schemas``: the reads and admin writes the API serves, and
  ``routes`` their HTTP side; ``summary``: a gate's Markdown summary (pure).

Imports: the models, the settings, ``bundles`` (for the closure), the runner's
``sequential``; never ``gates``, the worker or the command line, and only ``routes`` imports
HTTP code (import-linter contracts), so the worker and the gates' lifecycle can import it.
"""
