"""Gates: a submitted bundle's lifecycle from queued to its verdict, and how it is read.

Owns ``service`` (creation with its job, reads, cancellation, the worker's state changes,
the verdict), ``submission`` (the Upload value and the one submit_bundle use case),
``labels``, ``schemas``, ``notify`` (the API's LISTEN for long-polls) and ``status_reads``
(the status fast path's connections and queries). ``routes`` and ``upload`` are its HTTP
side. Imports the queue (jobs), admission, bundles, models and db; never the worker.
"""
