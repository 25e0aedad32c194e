"""gate_runner.ids: run ids in uuid4's text form, without importing uuid."""

from __future__ import annotations

import subprocess
import sys
import uuid

from gate_runner.ids import uuid4_text


def test_ids_are_version_4_uuids_in_their_standard_text() -> None:
    seen = set()
    for _ in range(2000):
        text = uuid4_text()
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # lower-case hex, 8-4-4-4-12
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        seen.add(text)
    assert len(seen) == 2000


def test_the_run_case_path_imports_neither_uuid_nor_platform() -> None:
    probe = (
        "import sys\n"
        "from gate_runner.case import later_runner_imports, runner_imports\n"
        "runner_imports(); later_runner_imports()\n"
        "print(sorted(m for m in ('uuid', 'platform', 'http.client', 'hashlib') if m in sys.modules))"
    )
    # A fresh interpreter, isolated as a case container's runner is.
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
