"""`gate`: serve (API + embedded workers), api, worker, images, submit, admin, record."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from .config import Settings

log = logging.getLogger("gate")


def _database_url(settings: Settings) -> tuple[str, Any]:
    """The configured server, or an embedded one under the data dir; migrated either way."""
    from . import migrate

    embedded = None
    url = settings.database_url
    if not url:
        from .pg import EmbeddedPostgres

        embedded = EmbeddedPostgres(settings.runtime_dir() / "postgres")
        url = embedded.url
    log.info("migrating the database")
    migrate.upgrade(url)
    return url, embedded


def _prepare_images(settings: Settings) -> None:
    from .sandbox.docker_engine import DockerSandbox

    sandbox = DockerSandbox(settings)
    try:
        log.info("preparing the runner image (the first time builds it; later starts reuse it)")
        tag = sandbox.runner_image()
        log.info("runner image %s ready", tag)
    finally:
        sandbox.close()


def _start_workers(
    settings: Settings, url: str, count: int, stop: threading.Event
) -> list[threading.Thread]:
    from .db import make_engine, make_sessionmaker
    from .sandbox.docker_engine import DockerSandbox
    from .worker.handler import WorkerContext
    from .worker.loop import Worker

    engine = make_engine(url, pool_size=max(2, settings.case_concurrency + 2))
    sessions = make_sessionmaker(engine)
    threads = []
    for i in range(count):
        # One engine client per worker: the docker SDK's HTTP session is not shared safely.
        ctx = WorkerContext(
            settings=settings, sessions=sessions, sandbox=DockerSandbox(settings), stop=stop
        )
        thread = threading.Thread(target=Worker(ctx).run, name=f"gate-worker-{i}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from .main import create_app

    url, embedded = _database_url(settings)
    _prepare_images(settings)
    stop = threading.Event()
    workers = _start_workers(settings, url, settings.embedded_workers, stop)
    app = create_app(settings.model_copy(update={"database_url": url}))
    log.info("serving on http://%s:%s", settings.host, settings.port)
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
    finally:
        stop.set()
        for thread in workers:
            thread.join(timeout=30)
        if embedded is not None:
            embedded.stop()
    return 0


def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from .main import create_app

    url, embedded = _database_url(settings)
    app = create_app(settings.model_copy(update={"database_url": url}))
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.database_url:
        print(
            "gate worker needs GATE_DATABASE_URL (workers share the API's database)",
            file=sys.stderr,
        )
        return 2
    url, _ = _database_url(settings)
    _prepare_images(settings)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: finishing the current case, then handing the job back", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    workers = _start_workers(settings, url, max(1, args.threads), stop)
    while any(t.is_alive() for t in workers):
        for thread in workers:
            thread.join(timeout=1)
    return 0


def cmd_images(args: argparse.Namespace, settings: Settings) -> int:
    _prepare_images(settings)
    return 0


def cmd_submit(args: argparse.Namespace, settings: Settings) -> int:
    from .client.api import EXIT_CODES, GateAPIError, GateClient, pack_project

    source = Path(args.path)
    if source.is_dir():
        bundle, name = pack_project(source), f"{source.resolve().name}.tar.gz"
    else:
        bundle, name = source.read_bytes(), source.name
    labels = dict(item.split("=", 1) for item in args.label or [])
    client = GateClient(args.url, token=args.token)
    try:
        gate = client.submit(bundle, filename=name, name_filter=args.filter, labels=labels)
        print(f"gate {gate['id']} queued ({len(bundle)} bytes)")
        if not args.wait:
            return 0
        seen: dict[str, str] = {"phase": ""}

        def progress(g: dict[str, Any]) -> None:
            done = sum(1 for c in g["cases"] if c["status"] not in ("queued", "running"))
            line = f"{g['status']}/{g['phase']}: {done}/{g['total_cases']} case(s) judged"
            if line != seen["phase"]:
                print(line, flush=True)
                seen["phase"] = line

        gate = client.wait(gate["id"], on_change=progress)
    except GateAPIError as exc:
        print(f"gate refused the bundle: {exc}", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2  # refused, unauthorised or broken: never a verdict
    finally:
        client.close()
    for case in gate["cases"]:
        mark = "PASS" if case["passed"] else "FAIL"
        print(
            f"{mark}  {case['agent_name']}::{case['test_name']}  "
            f"{case['successes']}/{case['runs']}  (threshold {case['success_threshold']}%)"
        )
    if gate.get("failure_reason"):
        print(f"\n{gate['status']}: {gate['failure_reason']}")
    for problem in gate.get("problems") or []:
        print(f"  - {problem.get('file')}: {problem.get('message')}")
    print(f"gate {gate['id']}: {gate['status']}")
    return EXIT_CODES.get(gate["status"], 2)


def cmd_admin(args: argparse.Namespace, settings: Settings) -> int:
    """A thin client of the admin API; prints its JSON answers."""
    import json

    from .client.api import GateAPIError, GateClient

    client = GateClient(args.url, token=args.token)
    try:
        if args.admin_command == "project-create":
            answer = client.create_project(args.name, retention_days=args.retention_days)
        elif args.admin_command == "token-create":
            answer = client.create_token(
                args.project, args.scope, expires_in_days=args.expires_in_days, name=args.name
            )
        elif args.admin_command == "token-list":
            answer = client.tokens(args.project)
        elif args.admin_command == "token-revoke":
            answer = client.revoke_token(args.token_id)
        else:
            answer = client.audit(limit=args.limit)
    except GateAPIError as exc:
        print(f"gate admin: {exc}", file=sys.stderr)
        return 2
    finally:
        client.close()
    print(json.dumps(answer, indent=2))
    return 0


def cmd_record(args: argparse.Namespace, settings: Settings) -> int:
    """Run the runner's `record` on this machine: live models, recordings written for replay."""
    import os
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(settings.runner_source_dir), env.get("PYTHONPATH", "")) if p
    )
    argv = [sys.executable, "-m", "gate_runner", "record", "--project", str(Path(args.path))]
    if args.suite:
        argv += ["--suite", args.suite]
    if args.filter:
        argv += ["--case", args.filter]
    return subprocess.run(argv, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="API + embedded workers (the embedded default)")
    sub.add_parser("api", help="the REST API alone")
    worker = sub.add_parser("worker", help="a worker alone (scale-out)")
    worker.add_argument("--threads", type=int, default=1)
    sub.add_parser("images", help="build the base and runner images, then exit")
    submit = sub.add_parser("submit", help="submit a project folder or archive to a gate")
    submit.add_argument("path")
    submit.add_argument("--wait", action="store_true", help="follow the gate to its verdict")
    submit.add_argument("--filter")
    submit.add_argument("--label", action="append", help="key=value, repeatable")
    admin = sub.add_parser("admin", help="projects, tokens and the audit trail (admin token)")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    project_create = admin_sub.add_parser("project-create", help="create a project")
    project_create.add_argument("name")
    project_create.add_argument("--retention-days", type=int)
    token_create = admin_sub.add_parser("token-create", help="issue a token (shown once)")
    token_create.add_argument("project")
    token_create.add_argument(
        "--scope", action="append", required=True, choices=["submit", "read", "admin"]
    )
    token_create.add_argument("--expires-in-days", type=int)
    token_create.add_argument("--name")
    token_list = admin_sub.add_parser("token-list", help="a project's tokens, without values")
    token_list.add_argument("project")
    token_revoke = admin_sub.add_parser("token-revoke", help="revoke a token by id")
    token_revoke.add_argument("token_id")
    audit = admin_sub.add_parser("audit", help="recorded events, newest first")
    audit.add_argument("--limit", type=int, default=100)
    for client_command in (submit, admin):
        client_command.add_argument(
            "--url", default=os.environ.get("GATE_URL", "http://127.0.0.1:8080")
        )
        client_command.add_argument(
            "--token",
            default=os.environ.get("GATE_TOKEN"),
            help="bearer token (default: GATE_TOKEN)",
        )
    record = sub.add_parser(
        "record", help="run a project's suites with live models and write replay recordings"
    )
    record.add_argument("path")
    record.add_argument("--suite", help="only this suite, e.g. tests/support.yaml")
    record.add_argument("--filter", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command in ("submit", "admin"):
        logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = Settings()
    commands = {
        "serve": cmd_serve,
        "api": cmd_api,
        "worker": cmd_worker,
        "images": cmd_images,
        "submit": cmd_submit,
        "admin": cmd_admin,
        "record": cmd_record,
    }
    return commands[args.command](args, settings)


if __name__ == "__main__":
    sys.exit(main())
