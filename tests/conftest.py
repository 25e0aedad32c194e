import os

# Before anything reads settings: tests run in the testing environment.
os.environ.setdefault("GATE_ENV", "testing")

pytest_plugins = [
    "tests.fixtures.db",
    "tests.fixtures.docker",
    "tests.fixtures.fake_llm",
    "tests.fixtures.live",
]
