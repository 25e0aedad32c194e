"""Entry point: ``python -m gate_runner run-case --project DIR --suite PATH --case NAME``.

Exit codes: 0 means the case was judged (the verdict is in the JSON, pass or fail); 2 means
the command line was wrong; 70 means the runner itself broke. The JSON document is written to
stdout between the marker lines, and nothing else the runner does writes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

BEGIN_MARKER = "===GATE-RUNNER-RESULT-BEGIN==="
END_MARKER = "===GATE-RUNNER-RESULT-END==="


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gate_runner")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run-case", help="run one test case and print its result")
    run.add_argument("--project", default="/bundle", type=Path)
    run.add_argument("--suite", required=True, help="suite path relative to the project")
    run.add_argument("--case", required=True, help="the case's name")
    args = parser.parse_args(argv)
    try:
        from .case import run_case

        result = run_case(args.project, args.suite, args.case)
        text = json.dumps(result, default=repr)
    except Exception:
        traceback.print_exc()
        return 70
    sys.stdout.write(f"{BEGIN_MARKER}\n{text}\n{END_MARKER}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
