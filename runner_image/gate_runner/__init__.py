"""The gate runner: runs one test case of a Connic-format agent project inside its container.

It never imports ``gate_service``; the two speak the versioned JSON contract of
``contract.py`` (its shapes, schema version and markers are written there once, and the
service validates against them).
"""

# Where a test image installs the bundle's requirements: after the runner on sys.path, and
# only in invocation processes (the service's sandbox builds the image to match).
BUNDLE_DEPS_DIR = "/opt/bundle-deps"

# Folders under tests/ that hold support files, not suites (spec §13.1, decided: skip them):
# the service's validation and the runner's plan find the same suites.
NON_SUITE_DIRS = ("files", "builders", "mocks", "models", "recordings")
