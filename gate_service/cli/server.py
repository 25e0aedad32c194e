"""The server side of `gate`: serve (API + embedded workers), api, worker, images, record."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from ..config import Settings
from ..logs import configure_logging, uvicorn_log_config

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import ASGIApp

    from ..metrics import Metrics

log = logging.getLogger("gate")
# How long a first start's token notice waits for `gate serve`'s worker process to start.
READY_SECONDS = 60.0


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
    """The runner image, once the sandbox's settings hold: a backend, network or runtime the
    engine cannot act on stops the process here, saying why (exit 2)."""
    from ..sandbox import SandboxSettingError, open_sandbox

    try:
        sandbox = open_sandbox(settings)
    except SandboxSettingError as exc:
        log.error("%s", exc)
        typer.echo(f"gate: {exc}", err=True)
        raise typer.Exit(2) from None
    log.info(
        "cases run on the %s backend under the %s runtime",
        settings.sandbox_backend,
        sandbox.runtime,
    )
    try:
        log.info("preparing the runner image (the first time builds it; later starts reuse it)")
        tag = sandbox.runner_image()
        log.info("runner image %s ready", tag)
    finally:
        sandbox.close()


def _start_workers(
    settings: Settings, url: str, count: int, stop: threading.Event, metrics: Metrics
) -> tuple[list[threading.Thread], list[threading.Event]]:
    """The worker threads, and the thread of their shared job wake-up (it ends on stop too);
    and each worker's ``started`` event."""
    from ..db import make_engine, make_sessionmaker
    from ..gateway import ModelGateway
    from ..gateway.spend import ProjectSpend
    from ..sandbox import open_sandbox
    from ..worker.handler import WorkerContext
    from ..worker.loop import Worker
    from ..worker.wakeup import JobWakeup

    if count < 1:
        return [], []
    engine = make_engine(url, pool_size=max(2, settings.case_concurrency + 2))
    sessions = make_sessionmaker(engine)
    # One LISTEN connection per process wakes its idle workers when a gate is queued.
    jobs = JobWakeup(url, stop)
    # One model gateway per process, shared by its workers: LiteLLM is imported once, at the
    # first gate that calls a model live.
    # Its projects' spending is kept in Postgres, so a project's budget holds across workers.
    gateway = (
        ModelGateway.from_settings(settings, project_spend=ProjectSpend(sessions))
        if settings.model_gateway
        else None
    )
    threads = [jobs.start()]
    started = []
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
        one = Worker(ctx)
        thread = threading.Thread(target=one.run, name=f"gate-worker-{i}", daemon=True)
        thread.start()
        threads.append(thread)
        started.append(one.started)
    return threads, started


def _report_ready(ready_fd: int, started: list[threading.Event]) -> None:
    """Write a line to ``ready_fd`` as each worker starts (it can claim a gate from then on),
    each from a waiting thread of its own, and close it once all have: `gate serve`
    (embedded.py) counts them for /readyz, and shows a first start's token once all have
    (or READY_SECONDS passed). A worker that never starts leaves its waiter waiting (a
    daemon thread) and the end open: the others are counted all the same."""
    lock = threading.Lock()
    left = [len(started)]

    def report(event: threading.Event) -> None:
        event.wait()
        with lock:
            try:
                os.write(ready_fd, b"started\n")
            except OSError:  # serve stopped listening: nothing waits for it
                pass
            left[0] -= 1
            if left[0] == 0:
                os.close(ready_fd)

    if not started:
        os.close(ready_fd)
    for event in started:
        threading.Thread(
            target=report, args=(event,), name="gate-worker-ready", daemon=True
        ).start()


class FirstTokenNotice:
    """A first start's token notice (main.first_token_notice), shown last.

    The app's start-up hands it over (``hold``) instead of writing it; it is written to stderr
    once the server listens and, under `gate serve`, its worker process has started (at most
    READY_SECONDS later), so that no start-up line buries it. It is shown once, and at the
    latest when the server stops (``show``), however it stops: the token is not shown again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: str | None = None

    def hold(self, text: str) -> None:
        with self._lock:
            self._text = text

    def show(self) -> None:
        """Write it now if it is held (and not shown yet)."""
        from ..main import show_now

        with self._lock:
            text, self._text = self._text, None
        if text is not None:
            show_now(text)

    def show_when(self, ready: threading.Event | None, timeout: float = READY_SECONDS) -> None:
        """Show it once ``ready`` is set or ``timeout`` passed (now without ``ready``), waiting
        in a thread of its own: the server does not wait for it."""
        with self._lock:
            if self._text is None:
                return
        if ready is None:
            self.show()
            return

        def wait_then_show() -> None:
            ready.wait(timeout)
            self.show()

        threading.Thread(target=wait_then_show, name="gate-first-token", daemon=True).start()

    def shower(
        self,
        app: FastAPI,
        workers_ready: threading.Event | None,
        ready: Callable[[], None] | None = None,
    ) -> Callable[[], Awaitable[None]]:
        """What the server awaits once it listens: ``ready`` (which says so once gates are
        claimed) is started, the app settles (its change listener connects, main.settled),
        then the notice is shown once ``workers_ready`` is set."""

        async def started() -> None:
            from ..main import settled

            with self._lock:
                held = self._text is not None
            if held:
                await settled(app)

            def then() -> None:
                # The ready line first, then the notice: the token stays the last thing.
                if ready is not None:
                    ready()
                if held:
                    self.show_when(workers_ready)

            threading.Thread(target=then, name="gate-ready-line", daemon=True).start()

        return started


def ready_line(address: str, workers_up: Callable[[], int] | None) -> Callable[[], None]:
    """The line `gate serve` logs once a gate submitted now is claimed at once: its first
    worker can claim (when /readyz turns 200)."""

    def say() -> None:
        if workers_up is not None:
            deadline = time.monotonic() + READY_SECONDS
            while workers_up() < 1:
                if time.monotonic() > deadline:
                    log.warning(
                        "no worker has started in %s s: /readyz answers 503 until one does",
                        READY_SECONDS,
                    )
                    return
                time.sleep(0.05)
        up = "" if workers_up is None else f", {max(1, workers_up())} worker(s) claiming gates"
        log.info("ready on %s (GET /readyz answers 200%s)", address, up)

    return say


def _run_uvicorn(
    app: ASGIApp,
    settings: Settings,
    on_started: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve ``app`` until uvicorn's own signal handling ends it (serve and api alike), as
    ``uvicorn.run`` does; ``on_started`` is awaited once it listens (after uvicorn's "running
    on" line), while it serves."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and on_started is not None:
                await on_started()

    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise, so a client on
    # loopback could rotate its address past the failure brake: only named proxies count.
    proxies = settings.trusted_proxy_list()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        log_config=uvicorn_log_config(settings),
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
    )
    server = Server(config)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)


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
        workers_ready: threading.Event | None = None
        workers_up: Callable[[], int] | None = None
        if settings.embedded_workers:
            workers = EmbeddedWorkers(url, settings.embedded_workers, metrics)
            workers.start()
            cleanup.callback(workers.stop)
            workers_ready, workers_up = workers.ready, workers.workers_up
        notice = FirstTokenNotice()
        app = create_app(
            settings.model_copy(update={"database_url": url}),
            metrics,
            show_first_token=notice.hold,
            workers_up=workers_up,
        )
        log.info("serving on http://%s:%s", settings.host, settings.port)
        address = f"http://{settings.host}:{settings.port}"
        try:
            _run_uvicorn(
                app,
                settings,
                on_started=notice.shower(app, workers_ready, ready_line(address, workers_up)),
            )
        finally:
            notice.show()


def api() -> None:
    """The REST API alone."""
    from ..main import create_app

    settings = Settings()
    configure_logging(settings)
    with _lifetime() as cleanup:
        url = _database_url(settings, cleanup)
        notice = FirstTokenNotice()
        app = create_app(
            settings.model_copy(update={"database_url": url}), show_first_token=notice.hold
        )
        try:
            _run_uvicorn(app, settings, on_started=notice.shower(app, None))
        finally:
            notice.show()


def worker(
    threads: Annotated[int, typer.Option(min=1, help="worker threads in this process")] = 1,
    metrics_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
    parent_pid: Annotated[int | None, typer.Option(hidden=True)] = None,
    ready_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """A worker alone (scale-out); needs GATE_DATABASE_URL.

    `gate serve` starts one with ``--metrics-fd`` (observations go to its /metrics),
    ``--parent-pid`` (it ends with serve) and ``--ready-fd`` (a line once its workers have
    started), see embedded.py.
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
    workers, started = _start_workers(settings, url, threads, stop, metrics)
    if ready_fd is not None:
        _report_ready(ready_fd, started)
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
