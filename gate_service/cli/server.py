"""The server side of `gate`: serve (API + embedded workers), api, worker, images, record."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from ..config import Settings
from ..logs import configure_logging, uvicorn_log_config

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from ..metrics import Metrics

log = logging.getLogger("gate")


def _database_url(settings: Settings, cleanup: ExitStack) -> str:
    """The configured server, or an embedded one under the data dir; migrated either way.

    An embedded server is stopped by ``cleanup``, so every exit path stops it, including a
    failing migration right after it started.
    """
    from .. import migrate

    url = settings.database_url
    if not url:
        from ..pg import EmbeddedPostgres

        embedded = EmbeddedPostgres(settings.runtime_dir() / "postgres")
        cleanup.callback(embedded.stop)
        url = embedded.url
    log.info("migrating the database")
    migrate.upgrade(url)
    return url


@contextmanager
def _lifetime() -> Iterator[ExitStack]:
    """What the process owns, released on every exit path: an ExitStack for the callers'
    cleanups (workers, the embedded Postgres), closed however the body ends.

    SIGTERM and SIGINT end the process through that path too. Python's default SIGTERM kills
    the process outright, skipping every ``finally``; and uvicorn, which handles both signals
    while it serves, raises the signal it caught again once it has shut down. Both reach this
    handler instead: the first signal raises SystemExit(0) (a requested stop), and any signal
    during the cleanup is only logged, so a second one cannot cut the cleanup short.
    """
    stopping = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            log.info("signal %s: already stopping", signum)
            return
        stopping = True
        log.info("signal %s: stopping", signum)
        raise SystemExit(0)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with ExitStack() as cleanup:
            try:
                yield cleanup
            finally:
                stopping = True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _prepare_images(settings: Settings) -> None:
    from ..sandbox import open_sandbox

    sandbox = open_sandbox(settings)
    try:
        log.info("preparing the runner image (the first time builds it; later starts reuse it)")
        tag = sandbox.runner_image()
        log.info("runner image %s ready", tag)
    finally:
        sandbox.close()


def _start_workers(
    settings: Settings, url: str, count: int, stop: threading.Event, metrics: Metrics
) -> list[threading.Thread]:
    """The worker threads, and the thread of their shared job wake-up (it ends on stop too)."""
    from ..db import make_engine, make_sessionmaker
    from ..gateway import ModelGateway
    from ..gateway.spend import ProjectSpend
    from ..sandbox import open_sandbox
    from ..worker.handler import WorkerContext
    from ..worker.loop import Worker
    from ..worker.wakeup import JobWakeup

    if count < 1:
        return []
    engine = make_engine(url, pool_size=max(2, settings.case_concurrency + 2))
    sessions = make_sessionmaker(engine)
    # One LISTEN connection per process wakes its idle workers when a gate is queued.
    jobs = JobWakeup(url, stop)
    # One model gateway per process, shared by its workers: LiteLLM is imported once, here.
    # Its projects' spending is kept in Postgres, so a project's budget holds across workers.
    gateway = (
        ModelGateway.from_settings(settings, project_spend=ProjectSpend(sessions))
        if settings.model_gateway
        else None
    )
    threads = [jobs.start()]
    for i in range(count):
        # One engine client per worker: the docker SDK's HTTP session is not shared safely.
        ctx = WorkerContext(
            settings=settings,
            sessions=sessions,
            sandbox=open_sandbox(settings),
            stop=stop,
            metrics=metrics,  # one registry per process, shared by its workers
            jobs=jobs,
            gateway=gateway,
        )
        thread = threading.Thread(target=Worker(ctx).run, name=f"gate-worker-{i}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def _run_uvicorn(app: ASGIApp, settings: Settings) -> None:
    """Serve ``app`` until uvicorn's own signal handling ends it (serve and api alike)."""
    import uvicorn

    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise, so a client on
    # loopback could rotate its address past the failure brake: only named proxies count.
    proxies = settings.trusted_proxy_list()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        log_config=uvicorn_log_config(settings),
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
    )


def serve() -> None:
    """API + embedded workers (the embedded default)."""
    from ..main import create_app

    settings = Settings()
    configure_logging(settings)
    # Cleanups run in reverse: the workers stop before the embedded Postgres they use.
    with _lifetime() as cleanup:
        url = _database_url(settings, cleanup)
        _prepare_images(settings)
        from ..metrics import Metrics
        from .embedded import EmbeddedWorkers

        # The workers' process relays its observations into the API's registry, so its
        # /metrics shows them.
        metrics = Metrics()
        if settings.embedded_workers:
            workers = EmbeddedWorkers(url, settings.embedded_workers, metrics)
            workers.start()
            cleanup.callback(workers.stop)
        app = create_app(settings.model_copy(update={"database_url": url}), metrics)
        log.info("serving on http://%s:%s", settings.host, settings.port)
        _run_uvicorn(app, settings)


def api() -> None:
    """The REST API alone."""
    from ..main import create_app

    settings = Settings()
    configure_logging(settings)
    with _lifetime() as cleanup:
        url = _database_url(settings, cleanup)
        _run_uvicorn(create_app(settings.model_copy(update={"database_url": url})), settings)


def worker(
    threads: Annotated[int, typer.Option(min=1, help="worker threads in this process")] = 1,
    metrics_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
    parent_pid: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """A worker alone (scale-out); needs GATE_DATABASE_URL.

    `gate serve` starts one with ``--metrics-fd`` (observations go to its /metrics) and
    ``--parent-pid`` (it ends with serve), see embedded.py.
    """
    settings = Settings()
    configure_logging(settings)
    if parent_pid is not None:
        from .embedded import die_with_parent

        die_with_parent(parent_pid)
    if not settings.database_url:
        typer.echo(
            "gate worker needs GATE_DATABASE_URL (workers share the API's database)", err=True
        )
        raise typer.Exit(2)
    url = _database_url(settings, ExitStack())  # a configured server: nothing to stop
    _prepare_images(settings)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: finishing the current case, then handing the job back", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    from ..metrics import Metrics, RelayedMetrics, serve_worker_metrics

    metrics: Metrics
    if metrics_fd is not None:
        metrics = RelayedMetrics(metrics_fd)
    else:
        metrics = Metrics()
        if settings.worker_metrics_port:  # this process's own registry: nothing else shows it
            serve_worker_metrics(settings, metrics)
    workers = _start_workers(settings, url, threads, stop, metrics)
    while any(t.is_alive() for t in workers):
        for thread in workers:
            thread.join(timeout=1)


def images() -> None:
    """Build the base and runner images, then exit."""
    _prepare_images(Settings())


def record(
    path: Annotated[Path, typer.Argument(help="the project folder")],
    suite: Annotated[
        str | None, typer.Option(help="only this suite, e.g. tests/support.yaml")
    ] = None,
    name_filter: Annotated[
        str | None, typer.Option("--filter", help="only cases whose name contains this")
    ] = None,
) -> None:
    """Run a project's suites with live models and write replay recordings."""
    import subprocess

    settings = Settings()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(settings.runner_source_dir), env.get("PYTHONPATH", "")) if p
    )
    argv = [sys.executable, "-m", "gate_runner", "record", "--project", str(path)]
    if suite:
        argv += ["--suite", suite]
    if name_filter:
        argv += ["--case", name_filter]
    raise typer.Exit(subprocess.run(argv, env=env, check=False).returncode)


def register(app: typer.Typer) -> None:
    for command in (serve, api, worker, images, record):
        app.command()(command)
