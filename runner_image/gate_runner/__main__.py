"""Entry point: ``python -I -m gate_runner run-case --project DIR --suite PATH --case NAME``
(and ``plan``, which a test image build runs once: see plan.py).

Exit codes: 0 means the case was judged (the verdict is in the JSON, pass or fail); 2 means
the command line was wrong; 70 means the runner itself broke. The JSON document (contract.py)
is written to stdout between the marker lines, and nothing else writes to the runner's stdout:
invocations print into pipes the runner reads.

The worker hands the runner the case's environment and a nonce that the result must carry on
its standard input (``--handoff``; see case_env.py), never in the container's environment: the
runner's own process starts with the image's fixed environment, so nothing a project
controls reaches the dynamic loader, libc or the interpreter of this root process. The
environment goes only to invocation processes, after they drop their uid; the nonce stays in
the pipe until the last invocation has ended, so it is never in the memory they inherit.
A case with a model gateway also gets its channel's token there: invocations inherit it in
memory (they call the model), never in their environment.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if argv is None and args_in[:1] == ["run-case"]:
        # A case container's runner: its cyclic garbage collector stays off. It ran through
        # the runner's imports again and again as they grew the heap, about 6 of the 115 ms
        # of CPU those imports take (measured interleaved in a case container, Python 3.11);
        # what this process makes besides is freed by reference counting, and the few cycles
        # it leaves (about 20 objects an invocation) live no longer than the case. Invocations
        # collect as usual: each turns the collector back on before user code runs
        # (invocations.py), and the runner's heap stays out of their collections.
        import gc

        gc.disable()
    import argparse
    import dataclasses
    import traceback
    from pathlib import Path

    from .dataclass_code import compiled_dataclasses, write

    # The runner's own modules, imported with their dataclass methods compiled at image build
    # (dataclass_code.py): the run-case path's all at once, here, before any user code or the
    # SDK is imported. The image build's `dataclass-code` step collects that code.
    collecting = args_in[:1] == ["dataclass-code"]
    collected: dict[str, Any] = {}
    lent = compiled_dataclasses({}, collect=collected) if collecting else compiled_dataclasses()
    with lent:
        from .invocations import DEFAULT_OUTPUT_LIMIT_BYTES, Isolation, make_undumpable

        if collecting or args_in[:1] == ["run-case"]:
            from .case import later_runner_imports, runner_imports

            runner_imports()
            if collecting:
                later_runner_imports()

    from .verdict import STOP_MODES

    parser = argparse.ArgumentParser(prog="gate_runner")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run-case", help="run one test case and print its result")
    run.add_argument("--project", default="/bundle", type=Path)
    run.add_argument("--suite", required=True, help="suite path relative to the project")
    run.add_argument("--case", required=True, help="the case's name")
    run.add_argument(
        "--invocation-uid",
        type=int,
        help="run user code under this uid (the runner must be root with SETUID/SETGID/KILL)",
    )
    run.add_argument(
        "--output-limit-bytes",
        type=int,
        default=DEFAULT_OUTPUT_LIMIT_BYTES,
        help="stdout and stderr one invocation may print; the rest is dropped",
    )
    run.add_argument("--scratch-dir", type=Path, help="the case's scratch space, e.g. /tmp")
    run.add_argument(
        "--model-mode",
        choices=("scripted", "replay", "live"),
        help="force this model mode on every LLM agent (the gate's model_mode)",
    )
    run.add_argument(
        "--guardrail-model",
        help="the project's judge model for prompt_injection, topic_restriction, "
        "system_prompt_leakage, data_exfiltration and relevance guardrails (none: skipped)",
    )
    run.add_argument(
        "--handoff",
        action="store_true",
        help="read the case's environment and the result nonce from stdin (see case_env.py)",
    )
    run.add_argument(
        "--model-socket",
        help="the model gateway's socket, when the handoff gives a gateway token (default: "
        "gateway_wire.SOCKET_PATH, where the worker mounts it)",
    )
    run.add_argument(
        "--stop-early",
        choices=STOP_MODES,
        help="start no more invocations once those judged decide the verdict: 'failing' once "
        "the case can no longer pass, 'decided' also once it has passed (default: run all)",
    )
    run.add_argument(
        "--wilson-max-runs",
        type=int,
        help="judge by the Wilson rule (the project's verdict_rule: wilson): while the "
        "case's interval holds its threshold, run one more invocation, up to this many in all",
    )
    record = sub.add_parser(
        "record", help="run suites with live models and write tests/recordings/ for replay"
    )
    record.add_argument("--project", default=".", type=Path)
    record.add_argument("--suite", help="only this suite (path relative to the project)")
    record.add_argument("--case", help="only cases whose name contains this")
    record.add_argument(
        "--guardrail-model", help="the judge model of the judged guardrails (none: skipped)"
    )
    planning = sub.add_parser(
        "plan", help="prepare every case once, at image build time, for the case containers"
    )
    planning.add_argument("--project", default="/bundle", type=Path)
    planning.add_argument("--out", required=True, help="where to write the plan (JSON)")
    planning.add_argument("--as-uid", type=int, help="drop to this uid once the file is open")
    measuring = sub.add_parser(
        "sdk-modules", help="write the modules the SDK's path imports (light.py), at image build"
    )
    measuring.add_argument("--out", required=True)
    compiling = sub.add_parser(
        "dataclass-code", help="write the runner's compiled dataclass code, at image build"
    )
    compiling.add_argument("--out", required=True)
    args = parser.parse_args(args_in)
    if args.command == "dataclass-code":
        write(args.out, collected)
        print(f"{len(collected)} dataclass method texts compiled")
        return 0
    if args.command == "sdk-modules":
        import json

        from .light import measure_sdk_modules

        with open(args.out, "w", encoding="utf-8") as file:
            json.dump(measure_sdk_modules(), file)
        return 0
    if args.command == "plan":
        from .plan_build import write_plan

        return write_plan(args.project, args.out, args.as_uid)
    if args.command == "record":
        return _record(args.project.resolve(), args.suite, args.case, args.guardrail_model)
    try:
        from . import case_env
        from .case import run_case
        from .contract import framed

        if args.invocation_uid is not None:
            make_undumpable()  # before the handoff is read: no /proc/<pid>/fd/0 for anyone
        handoff = case_env.read_handoff() if args.handoff else case_env.Handoff()
        gateway = None
        if handoff.gateway_token is not None:  # the worker gave this case a gateway channel
            with compiled_dataclasses():
                from .gateway_wire import SOCKET_PATH
                from .models import GatewayChannel

            gateway = GatewayChannel(
                token=handoff.gateway_token, socket_path=args.model_socket or SOCKET_PATH
            )
        isolation = Isolation(
            uid=args.invocation_uid,
            output_limit_bytes=args.output_limit_bytes,
            scratch_dir=args.scratch_dir,
            env=handoff.env,
            gateway=gateway,
            api_tools=handoff.api_tools,
            guardrail_model=args.guardrail_model or None,
        )
        from .plan import PLANNED_PROJECT, read_plan

        # The test image's plan is of /bundle: another --project is prepared from its suites.
        plan = read_plan() if args.project.resolve() == Path(PLANNED_PROJECT) else None
        result = run_case(
            args.project,
            args.suite,
            args.case,
            isolation,
            args.model_mode,
            plan,
            args.stop_early,
            args.wilson_max_runs,
        )
        nonce = case_env.read_nonce() if args.handoff else None
        text = dataclasses.replace(result, nonce=nonce).to_json()
    except Exception:
        traceback.print_exc()
        return 70
    sys.stdout.write(framed(text))
    sys.stdout.flush()
    if argv is None:  # the process is ours alone (python -m gate_runner), not a test's
        # Everything is said and every invocation has ended: tearing down the interpreter
        # (the SDK and pydantic, when the project imported them) would only cost the case
        # time, about 30 ms of CPU with the SDK loaded.
        sys.stderr.flush()
        os._exit(0)
    return 0


def _record(
    project: Path, only_suite: str | None, name_filter: str | None, guardrail_model: str | None
) -> int:
    """Run every selected case live, recording each model exchange; print the verdicts."""
    import yaml

    from .case import run_case, suite_paths
    from .invocations import Isolation

    os.environ["GATE_MODEL_MODE"] = "record"
    failures = 0
    for rel in suite_paths(project):
        path = project / rel
        if only_suite and rel != only_suite:
            continue
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for case in raw.get("tests") or []:
            name = str(case.get("name", ""))
            if name_filter and name_filter not in name:
                continue
            result = run_case(project, rel, name, Isolation(guardrail_model=guardrail_model))
            mark = "PASS" if result.passed else "FAIL"
            failures += 0 if result.passed else 1
            print(
                f"{mark}  {rel}::{name}  {result.successes}/{result.runs}"
                + (f"  {result.failure_reason}" if result.failure_reason else "")
            )
    print(f"recordings written under {project / 'tests' / 'recordings'}; {failures} case(s) failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
