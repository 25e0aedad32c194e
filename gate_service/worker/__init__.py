"""The job worker: claims gates from the queue (jobs.py) and judges them in the sandbox.

Owns the loop (``loop``), judging one gate (``handler``), a case's outcome (``outcome``, a
pure function), fair shares of places and slots (``slots``), the LISTEN wake-up
(``wakeup``), retention and garbage collection. Imports services, the queue, the sandbox
port and the metrics instruments; never HTTP code, the app or the command line.
"""
