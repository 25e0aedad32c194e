"""The gate runner: runs one test case of a Connic-format agent project inside its container.

It never imports ``gate_service``; the two speak the versioned JSON contract in ``result.py``.
"""

SCHEMA_VERSION = 2
# Where a test image installs the bundle's requirements: after the runner on sys.path, and
# only in invocation processes (the service's sandbox builds the image to match).
BUNDLE_DEPS_DIR = "/opt/bundle-deps"
