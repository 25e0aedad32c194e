"""All settings, read once from the environment with the GATE_ prefix."""

from __future__ import annotations

import ipaddress
import os
from enum import StrEnum
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gate_runner.case_env import refusal
from gate_service.resources import runner_image_dir
from gate_service.stored_runs import MIN_STORED_RUN_BYTES

MIB = 1024 * 1024


def default_case_concurrency() -> int:
    """One case container per CPU: each is mostly one busy Python process."""
    return os.cpu_count() or 1


class BaseImageSource(StrEnum):
    auto = "auto"  # use GATE_BASE_IMAGE if present or pullable, else bootstrap one
    pull = "pull"  # GATE_BASE_IMAGE must be present or pullable
    debootstrap = "debootstrap"  # always build the base from Debian packages


class SandboxBackend(StrEnum):
    """The engines that can build images and run case containers (gate_service.sandbox)."""

    docker = "docker"


class LogFormat(StrEnum):
    text = "text"  # one human line per record
    json = "json"  # one JSON object per line, with gate_id, case and worker where known


class Settings(BaseSettings):
    """Every knob of the service. Units are part of each name."""

    model_config = SettingsConfigDict(env_prefix="GATE_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL; unset means an embedded server under GATE_DATA_DIR.",
    )
    data_dir: Path = Field(default=Path("~/.local/share/gate").expanduser())
    host: str = "127.0.0.1"
    port: int = 8080

    # Browser safety
    trusted_hosts: str = Field(
        default="localhost,127.0.0.1,::1",
        description="Comma-separated host names the API answers to (the Host header, port "
        "ignored); others get 400. '*.example.com' matches subdomains, '*' any host.",
    )
    cors_origins: str = Field(
        default="",
        description="Comma-separated origins (https://ci.example.com) browsers may call the API "
        "from, without credentials. Empty: no CORS headers at all.",
    )

    # Results pages (gate_service.ui)
    public_url: str = Field(
        default="",
        description="The service's address as a browser reaches it (https://gate.example.com, "
        "behind any proxy): html_url is absolute under it. Empty: html_url is a path "
        "(/ui/gates/<id>), which `gate submit` completes with its GATE_URL.",
    )
    ui_session_hours: float = Field(
        default=12.0,
        gt=0,
        le=24 * 30,
        description="How long a sign-in to the results pages lasts (at most until its token "
        "expires; revoking the token ends it at once).",
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value:
            return ""
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        # No path: the pages and their redirects live at /ui of the host (a proxy that
        # mounts the service under a prefix would need root_path throughout).
        if (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.path
            or parts.query
            or parts.fragment
        ):
            raise ValueError(
                f"GATE_PUBLIC_URL must be an http(s) origin with no path, query or fragment, "
                f"like https://gate.example.com; got {value!r}"
            )
        return value

    # Sandbox and images
    sandbox_backend: SandboxBackend = Field(
        default=SandboxBackend.docker,
        description="The engine that builds test images and runs case containers.",
    )
    base_image: str = "python:3.11-slim"
    base_image_source: BaseImageSource = BaseImageSource.auto
    debootstrap_mirror: str | None = Field(
        default=None, description="Debian mirror for debootstrap; default: apt's own mirror."
    )
    runner_source_dir: Path = Field(
        default_factory=runner_image_dir,
        description="Where the runner package and its Dockerfile live (the runner image's "
        "build context); default: the copy installed with the service.",
    )
    wheelhouse_dir: Path | None = Field(
        default=None,
        description="Extra wheels (--find-links) for the runner and bundle requirements.",
    )
    pip_index_url: str | None = Field(
        default=None, description="Package index for bundle requirements; default: pip's own."
    )
    pip_offline: bool = Field(
        default=False, description="Install only from GATE_WHEELHOUSE_DIR, never an index."
    )
    pip_download_timeout_seconds: float = Field(
        default=300, gt=0, description="Time pip may take to fetch a bundle's wheels."
    )
    pip_download_max_bytes: int = Field(
        default=512 * MIB, ge=1, description="Bytes pip may fetch for a bundle's wheels."
    )
    build_timeout_seconds: float = Field(
        default=600, gt=0, description="Time a test image build may take."
    )
    build_output_limit_bytes: int = Field(
        default=4 * MIB, ge=1, description="Build log a test image build may write."
    )

    # Worker
    embedded_workers: int = Field(
        default=1,
        ge=0,
        description="Worker threads of `gate serve`'s worker process (a process of its own, "
        "so no worker step can stall the API); 0: no worker.",
    )
    case_concurrency: int = Field(
        default_factory=default_case_concurrency,
        ge=1,
        description="Case containers one worker runs at once, shared by the gates it holds "
        "by fair share between their projects (a project under its share while all are "
        "taken is served on top, up to twice this); default: the machine's CPU count.",
    )
    max_case_containers: int = Field(
        default=0,
        ge=0,
        description="Case containers one worker keeps at once, those waiting on a model "
        "included: a live case lends its case slot (GATE_CASE_CONCURRENCY) to the next case "
        "while it waits for its model's answer, so more cases run than there are cores; this "
        "bounds them for memory. 0: half the machine's memory over GATE_CASE_MEMORY_MB, "
        "between GATE_CASE_CONCURRENCY and 8 times it.",
    )
    worker_gates: int = Field(
        default=2,
        ge=1,
        description="Gates one worker judges at once (it claims another while it holds fewer, "
        "and one of a project under its fair share even when all are taken, up to twice "
        "this); their cases share its GATE_CASE_CONCURRENCY slots by project, then "
        "round-robin by gate, so a small gate is not stuck behind a large one.",
    )
    job_lease_seconds: int = Field(default=60, ge=5)
    job_max_attempts: int = Field(default=3, ge=1)
    worker_poll_seconds: float = Field(
        default=0.5,
        gt=0,
        description="Longest idle wait between queue looks; a queued gate wakes workers at once.",
    )
    retention_interval_seconds: float = Field(
        default=3600,
        ge=0,
        description="How often, at most, each worker process runs the retention pass "
        "(deletes what is older than its project's retention_days); 0 turns it off.",
    )
    retention_batch_size: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="Rows the retention pass deletes per transaction.",
    )
    gc_interval_seconds: float = Field(
        default=3600,
        ge=0,
        description="How often, at most, each worker process collects garbage (test images "
        "past GATE_TEST_IMAGE_BUDGET_BYTES, runner images of old digests, images and build "
        "scratch directories left by crashed builds); 0 turns the image part off.",
    )
    test_image_budget_bytes: int = Field(
        default=10 * 1024 * MIB,
        ge=0,
        description="Disk the `gate-test:*` images of one Docker engine may hold (bytes of "
        "their own layers); past it the least recently used go first.",
    )
    gc_grace_seconds: float = Field(
        default=3600,
        ge=0,
        description="Images built or used more recently than this are never collected.",
    )

    # Case containers; the runner's own timeout_s applies inside these limits.
    case_memory_mb: int = 512
    case_cpus: float = 1.0
    case_pids_limit: int = 256
    case_tmpfs_mb: int = 64
    # A case container's hard deadline is runs * (timeout_s + min(timeout_s, 120) + 5) plus
    # this: each invocation's own limit, its builder cleanup's budget and 5 s to fork and
    # judge it (worker/handler.py), then the container's start and the verdict's writing.
    case_deadline_slack_seconds: int = 60
    case_output_limit_bytes: int = 32 * MIB
    case_invocation_output_limit_bytes: int = Field(
        default=8 * MIB,
        ge=1024,
        description="stdout and stderr one invocation may print; past it the rest is dropped "
        "and the invocation fails saying so.",
    )
    max_stored_run_bytes: int = Field(
        default=MIB,
        ge=MIN_STORED_RUN_BYTES,
        description="Bytes one run may store (the JSON text of its input, output, error, "
        "reasons, context, every span and key); past it the longest strings are cut first, "
        "each cut marked …[N bytes cut], and the run's failure_reason says so.",
    )
    case_env: str = Field(
        default="",
        description="Comma-separated variables passed from the worker to the invocations of "
        "case containers, where every tool of the bundle can read them (provider keys belong in "
        "project secrets, which the model gateway keeps out of cases); names the loader, "
        "libc, Python or the gate act on (LD_*, PYTHON*, GATE_*, ...) are refused at start-up.",
    )
    case_network: str = Field(
        default="none", description="Docker network for case containers; 'none' cuts them off."
    )

    model_gateway: bool = Field(
        default=True,
        description="Serve live model calls from each worker's model gateway: every case gets "
        "a Unix socket of its own as its one way out, and the project's provider keys stay "
        "with the worker. Off, cases get no channel, so a gate with a live agent ends error "
        "in validating saying so: the runner image carries no provider library.",
    )
    # The model gateway (gate_service/gateway): budgets per gate and per project; 0 = no limit.
    gateway_socket_root: Path | None = Field(
        default=None,
        description="Host folder under which each live case's channel folder (its Unix "
        "socket) is made; a socket path must stay under 108 bytes. Default: "
        "$TMPDIR/gate-gateway.",
    )
    gateway_gate_max_calls: int = Field(
        default=1000, ge=0, description="Model calls one gate may make; 0: no limit."
    )
    gateway_gate_max_tokens: int = Field(
        default=2_000_000,
        ge=0,
        description="Tokens (prompt and completion) one gate's calls may use; the call that "
        "crosses it is answered, the next refused. 0: no limit.",
    )
    gateway_gate_max_cost_usd: float = Field(
        default=0.0,
        ge=0,
        description="Dollars one gate's calls may cost, priced by LiteLLM's cost map (a model "
        "it does not know costs 0); 0: no limit.",
    )
    gateway_gate_max_concurrent_calls: int = Field(
        default=8,
        ge=0,
        description="Model calls of one gate in flight at once; one more waits for a place "
        "(until the gate's deadline). 0: no limit.",
    )
    gateway_project_max_calls: int = Field(
        default=0,
        ge=0,
        description="Model calls one project may make per GATE_GATEWAY_PROJECT_WINDOW_SECONDS, "
        "counted in Postgres across every worker; 0: no limit.",
    )
    gateway_project_max_tokens: int = Field(
        default=0, ge=0, description="Tokens of one project per window, all workers; 0: none."
    )
    gateway_project_max_cost_usd: float = Field(
        default=0.0, ge=0, description="Dollars of one project per window, all workers; 0: none."
    )
    gateway_project_max_concurrent_calls: int = Field(
        default=16,
        ge=0,
        description="Model calls of one project in flight at once in one worker; 0: no limit.",
    )
    gateway_project_window_seconds: float = Field(
        default=86400,
        ge=0,
        description="How long a project's call, token and cost counts run before they start "
        "again (windows aligned to the epoch); 0: never.",
    )
    gateway_retry_backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        description="First wait before retrying a provider error that names no Retry-After "
        "(doubled each try, at most 30 s); a 429's Retry-After is honoured as it is.",
    )

    # Tokens
    bootstrap_token: SecretStr | None = Field(
        default=None,
        description="Start-up makes sure project `default` exists with this admin token "
        "(compose, CI, first use). Unset: the first start creates one, prints it once and "
        "writes it 0600 to GATE_DATA_DIR/admin-token.",
    )
    auth_failure_limit: int = Field(
        default=20, ge=1, description="Failed authentications per client per window before 429."
    )
    auth_failure_window_seconds: int = Field(default=60, ge=1)
    auth_failure_audit_limit: int = Field(
        default=100,
        ge=1,
        description="Audit rows for refused tokens one API process writes per "
        "GATE_AUTH_FAILURE_WINDOW_SECONDS; past it refusals are counted, and the next row "
        "says how many were left out.",
    )
    trusted_proxies: str = Field(
        default="",
        description="Comma-separated addresses or networks (10.0.0.0/8) of reverse proxies "
        "whose X-Forwarded-For and X-Forwarded-Proto are believed; empty: none, and the "
        "failure brake counts the connecting peer's address.",
    )

    # Secrets
    secrets_key: SecretStr | None = Field(
        default=None,
        description="Fernet key that encrypts project secrets at rest. Unset: one is made on "
        "first use and kept 0600 in GATE_DATA_DIR/secrets.key. The API and every worker must "
        "hold the same key, so set it when they run on different hosts.",
    )

    # Intake
    upload_limit_bytes: int = 25 * MIB
    long_poll_max_seconds: int = 60
    long_poll_settle_seconds: float = Field(
        default=0.5,
        ge=0,
        le=10,
        description="A ?wait= long-poll woken by a change of a gate that has not ended gathers "
        "what else changes for up to this long into one answer; an end is answered at once. "
        "0: every change is answered as it comes.",
    )

    # Admission control: every cap answers at once (429, 503, or the gate ends `error`).
    max_queued_gates_per_project: int = Field(
        default=20, ge=1, description="Gates of one project waiting for a worker; past it 429."
    )
    max_bundle_bytes_per_project: int = Field(
        default=1024 * MIB,
        ge=1,
        description="Bytes of the distinct bundles one project's gates reference; past it 429 "
        "until retention deletes old gates.",
    )
    max_result_bytes_per_project: int = Field(
        default=10 * 1024 * MIB,
        ge=1,
        description="Bytes of stored run results (GATE_MAX_STORED_RUN_BYTES counts them) one "
        "project's gates hold; past it a submission is 429 until retention deletes old gates, "
        f"and a run stored meanwhile keeps at most {MIN_STORED_RUN_BYTES} bytes.",
    )
    max_running_gates_per_project: int = Field(
        default=2,
        ge=1,
        description="Gates of one project judged at once; workers leave its other jobs queued.",
    )
    max_queued_gates: int = Field(
        default=500, ge=1, description="Gates waiting for a worker, all projects; past it 503."
    )
    max_cases_per_gate: int = Field(
        default=500, ge=1, description="Cases one gate may select; more end it `error`."
    )
    gate_deadline_seconds: int = Field(
        default=3600,
        ge=1,
        description="Time a gate may take from its start; past it the gate ends `error`.",
    )
    max_concurrent_uploads: int = Field(
        default=8, ge=1, description="Uploads one API process receives at once; past it 503."
    )
    max_concurrent_long_polls: int = Field(
        default=1000, ge=1, description="?wait= requests one API process holds; past it 503."
    )
    # A project's share of the two above, so that one project cannot take every slot.
    max_concurrent_uploads_per_project: int | None = Field(
        default=None,
        ge=1,
        description="Uploads one project may have in progress at once in one API process "
        "(its share of GATE_MAX_CONCURRENT_UPLOADS); past it 429. Unset: half of "
        "GATE_MAX_CONCURRENT_UPLOADS, at least 1.",
    )
    max_concurrent_long_polls_per_project: int | None = Field(
        default=None,
        ge=1,
        description="?wait= requests one project may have held at once in one API process "
        "(its share of GATE_MAX_CONCURRENT_LONG_POLLS); past it 429. Unset: half of "
        "GATE_MAX_CONCURRENT_LONG_POLLS, at least 1.",
    )
    upload_min_bytes_per_second: int = Field(
        default=16 * 1024,
        ge=0,
        description="Slowest an upload's body may arrive: fewer bytes than this rate times "
        "GATE_UPLOAD_RATE_GRACE_SECONDS in any such stretch of it (the first one included) "
        "cuts it with 408, so a trickling client cannot hold an upload slot. 0: no minimum.",
    )
    upload_rate_grace_seconds: float = Field(
        default=10,
        gt=0,
        description="The stretch of time GATE_UPLOAD_MIN_BYTES_PER_SECOND is measured over; "
        "the first one is an upload's grace period.",
    )

    # Observability
    log_format: LogFormat = Field(
        default=LogFormat.text,
        description="'json' writes one JSON object per line carrying gate_id, case_id, case "
        "and worker where known; 'text' one human line.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token that may read /metrics (besides admin tokens of project "
        "`default`); for Prometheus' bearer_token_file.",
    )
    worker_metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port where a standalone `gate worker` serves its own /metrics "
        "(durations, container starts, image cache, reaped containers); 0: none.",
    )
    worker_metrics_host: str = Field(
        default="0.0.0.0",
        description="Address GATE_WORKER_METRICS_PORT listens on.",
    )

    @field_validator("sandbox_backend", mode="before")
    @classmethod
    def _known_backend(cls, value: object) -> object:
        # Named here, at start-up, with the choices: a typo must not wait for the first build.
        choices = [backend.value for backend in SandboxBackend]
        if isinstance(value, str) and value not in choices:
            raise ValueError(
                f"GATE_SANDBOX_BACKEND is {value!r}; the choices are: {', '.join(choices)}"
            )
        return value

    @field_validator("case_env")
    @classmethod
    def _case_env_names(cls, value: str) -> str:
        # The same rule as a project secret's name (gate_runner/case_env.py), at start-up.
        for name in (n.strip() for n in value.split(",")):
            why = refusal(name) if name else None
            if why:
                raise ValueError(f"GATE_CASE_ENV names {name!r}: {why}")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_addresses(cls, value: str) -> str:
        for item in (i.strip() for i in value.split(",")):
            if item:
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError:
                    raise ValueError(
                        f"GATE_TRUSTED_PROXIES: {item!r} is not an IP address or network"
                    ) from None
        return value

    def trusted_proxy_list(self) -> list[str]:
        return [item.strip() for item in self.trusted_proxies.split(",") if item.strip()]

    def case_container_limit(self) -> int:
        """GATE_MAX_CASE_CONTAINERS, or when 0 what the machine's memory allows (see there)."""
        if self.max_case_containers:
            return max(self.max_case_containers, self.case_concurrency)
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return self.case_concurrency
        fits = memory // 2 // (self.case_memory_mb * 1024 * 1024)
        return max(self.case_concurrency, min(fits, 8 * self.case_concurrency))

    def case_env_names(self) -> list[str]:
        """GATE_CASE_ENV's names; a refused one is left out even where validation was skipped."""
        names = (n.strip() for n in self.case_env.split(","))
        return [name for name in names if name and refusal(name) is None]

    def runtime_dir(self) -> Path:
        path = self.data_dir.expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path
