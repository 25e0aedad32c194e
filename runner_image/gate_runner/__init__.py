"""The gate runner: runs one test case of a Connic-format agent project inside its container.

It never imports ``gate_service``; the two speak the versioned JSON contract in ``result.py``.
"""

SCHEMA_VERSION = 1
