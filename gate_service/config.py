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
# The most case containers GATE_MAX_CASE_CONTAINERS=0 picks for one worker, whatever its
# memory: a live case's calls take connections of the worker process's model gateway, at
# most 256 in all (gateway/channel.py MAX_PROCESS_CONNECTIONS, each a thread once it is a
# call in flight), so a case past it would only wait there, holding its memory.
MAX_AUTO_CASE_CONTAINERS = 256
# GATE_CASE_RUNTIME's value that means gVisor.
GVISOR_RUNTIME = "runsc"


def is_gvisor(runtime: str | None) -> bool:
    """Whether a case runtime's name is gVisor's: runsc, or a variant registered as runsc-*
    (runsc-kvm, runsc-debug). A runtime registered under another name is not recognised."""
    return runtime is not None and (runtime == GVISOR_RUNTIME or runtime.startswith("runsc-"))


def gvisor_host_tasks(guest_tasks: int) -> int:
    """Host tasks a gVisor case container needs for ``guest_tasks`` (Settings.case_host_pids):
    4 n^2 + 64, over what a fork bomb held at n reached here (4: 103 of 128; 8: 240 of 320;
    16: about 700 of 1,088; 32: 2,150 of 4,160)."""
    return 4 * guest_tasks * guest_tasks + 64


# Under GATE_DATA_DIR: the admin token a first start made (without GATE_BOOTSTRAP_TOKEN).
ADMIN_TOKEN_FILE = "admin-token"


def default_case_concurrency() -> int:
    """One case container per CPU: each is mostly one busy Python process."""
    return os.cpu_count() or 1


def machine_pid_max() -> int | None:
    """The host's pid_max (one table for the whole machine, containers included), None where
    the system does not say."""
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return None


def machine_memory_bytes() -> int | None:
    """The machine's physical memory, None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


class BaseImageSource(StrEnum):
    auto = "auto"  # use GATE_BASE_IMAGE if present or pullable, else bootstrap one
    pull = "pull"  # GATE_BASE_IMAGE must be present or pullable
    debootstrap = "debootstrap"  # always build the base from Debian packages


class LogFormat(StrEnum):
    text = "text"  # one human line per record
    json = "json"  # one JSON object per line, with gate_id, case and worker where known


class Settings(BaseSettings):
    """Every knob of the service. Units are part of each name."""

    model_config = SettingsConfigDict(env_prefix="GATE_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL; unset means an embedded server under `GATE_DATA_DIR`",
    )
    data_dir: Path = Field(
        default=Path("~/.local/share/gate").expanduser(),
        description="embedded Postgres, build scratch space",
        json_schema_extra={"shown_default": "`~/.local/share/gate`"},
    )
    host: str = Field(default="127.0.0.1", description="where the API listens: the address")
    port: int = Field(default=8080, description="where the API listens: the port")

    # Browser safety
    trusted_hosts: str = Field(
        default="localhost,127.0.0.1,::1",
        description=(
            "comma-separated names the API answers to, compared with the `Host` header "
            "without its port; any other gets `400`. `*.example.com` matches subdomains, `*` "
            "any host. Set the names clients use when the API is reached from elsewhere "
            "(compose sets `localhost,127.0.0.1,::1,api,gate`)"
        ),
    )
    cors_origins: str = Field(
        default="",
        description=(
            "comma-separated origins (`https://ci.example.com`) whose browser pages may call "
            "the API, without credentials; empty: no CORS headers at all"
        ),
    )

    # Results pages (gate_service.ui)
    public_url: str = Field(
        default="",
        description=(
            "the service's address as a browser reaches it (`https://gate.example.com`, "
            "behind any proxy; an origin: no path, no query): `html_url` is absolute under "
            "it. Empty: `html_url` is a path (`/ui/gates/<id>`), which `gate submit` "
            "completes with its `GATE_URL`"
        ),
    )
    ui_session_hours: float = Field(
        default=12.0,
        gt=0,
        le=24 * 30,
        description=(
            "how long a sign-in to the results pages lasts (never past its token's expiry; "
            "revoking the token ends it at once)"
        ),
        json_schema_extra={"shown_default": "`12`"},
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
    sandbox_backend: str = Field(
        default="docker",
        description=(
            "the engine that builds test images and runs case containers: a name in "
            "`gate_service/sandbox/factory.py`'s `BACKENDS` (`docker` today); a worker (`gate "
            "serve`, `gate worker`, `gate images`) given another stops at start-up, naming "
            "the choices"
        ),
    )
    case_runtime: str | None = Field(
        default=None,
        description=(
            "the OCI runtime of case containers and of the build step that compiles a "
            "bundle's code (Docker's `--runtime`): unset, the engine's default (runc); "
            "`runsc` runs them under gVisor, a user-space kernel between a bundle and the "
            "host's (docs/threat-model.md). A worker whose engine has no runtime of that name "
            "stops at start-up, saying how to register it"
        ),
    )
    base_image: str = Field(
        default="python:3.11-slim", description="what the runner image is built FROM"
    )
    base_image_source: BaseImageSource = Field(
        default=BaseImageSource.auto,
        description=(
            "`auto`: the base image if present or pullable, else bootstrap Debian bookworm "
            "with debootstrap; `pull`: the base image or fail; `debootstrap`: always "
            "bootstrap"
        ),
    )
    debootstrap_mirror: str | None = Field(
        default=None,
        description="Debian mirror for debootstrap",
        json_schema_extra={"shown_default": "apt's own mirror"},
    )
    runner_source_dir: Path = Field(
        default_factory=runner_image_dir,
        description=(
            "the runner package and its Dockerfile (`gate_service/runner_image` in a wheel, "
            "`runner_image/` of a checkout)"
        ),
        json_schema_extra={"shown_default": "the runner build context installed with the service"},
    )
    wheelhouse_dir: Path | None = Field(
        default=None,
        description="extra wheels (`--find-links`) for the runner and bundle requirements",
    )
    pip_index_url: str | None = Field(
        default=None,
        description="package index for bundle requirements",
        json_schema_extra={"shown_default": "pip's own"},
    )
    pip_offline: bool = Field(
        default=False, description="install only from `GATE_WHEELHOUSE_DIR` (air-gapped)"
    )
    pip_download_timeout_seconds: float = Field(
        default=300,
        gt=0,
        description="time pip may take to fetch a bundle's wheels before it is killed",
    )
    pip_download_max_bytes: int = Field(
        default=512 * MIB,
        ge=1,
        description="bytes pip may fetch for a bundle's wheels before it is killed",
    )
    build_timeout_seconds: float = Field(
        default=600, gt=0, description="time a test image build may take before it is stopped"
    )
    build_output_limit_bytes: int = Field(
        default=4 * MIB,
        ge=1,
        description=(
            "build log a test image build with requirements may write before it is stopped (a "
            "bundle without them runs only our compile step, whose log the engine caps at 1 "
            "MiB and the gate reads only when the step fails)"
        ),
    )

    # Worker
    embedded_workers: int = Field(
        default=1,
        ge=0,
        description=(
            "worker threads of `gate serve`'s worker process: `gate serve` runs them in one "
            "`gate worker` child process, never in the API's process, so no worker step can "
            "stall the API; it relays its metrics to the API's `/metrics`, is started again "
            "if it dies and ends with `gate serve`; `0`: no worker"
        ),
    )
    case_concurrency: int = Field(
        default_factory=default_case_concurrency,
        ge=1,
        description=(
            "cases one worker runs at once that compute (a live case waiting on its model "
            "lends its slot, see [Live models](live-models.md)), shared by the gates it holds "
            "by fair share between their projects; a project under its share while every slot "
            "is taken is served at once on top, so a worker runs at most twice this many for "
            "a while"
        ),
        json_schema_extra={"shown_default": "CPU count"},
    )
    max_case_containers: int = Field(
        default=0,
        ge=0,
        description=(
            "case containers one worker keeps at once, those waiting on a model included, "
            "shared by the same fair-share rule; `0`: as many as half the machine's memory "
            "holds at `GATE_CASE_MEMORY_MB` each and half its `pid_max` at each one's pids "
            "limit, at least `GATE_CASE_CONCURRENCY` and at most 256 (the model gateway's "
            "connections per worker process: a live case past them would only wait for one)"
        ),
        json_schema_extra={"shown_default": "`0` (auto)"},
    )
    worker_gates: int = Field(
        default=2,
        ge=1,
        description=(
            "gates one worker judges at once (it claims another while it holds fewer); a "
            "project under its fair share of them is claimed even when all are taken, up to "
            "twice this many; their cases share its `GATE_CASE_CONCURRENCY` slots, by project "
            "and then round-robin by gate, so a small gate is not stuck behind a large one, "
            "nor one project's behind another's"
        ),
    )
    job_lease_seconds: int = Field(
        default=60, ge=5, description="a worker's lease on a job; renewed every third of it"
    )
    job_max_attempts: int = Field(
        default=3, ge=1, description="attempts before a gate ends `error` on infrastructure trouble"
    )
    worker_poll_seconds: float = Field(
        default=0.5,
        gt=0,
        description=(
            "longest an idle worker waits before it looks at the queue again; a job queued, "
            "handed back or ended wakes it at once (`LISTEN gate_jobs`), so this bounds only "
            "a missed notification, and it is the back-off after an unexpected error"
        ),
    )
    retention_interval_seconds: float = Field(
        default=3600,
        ge=0,
        description=(
            "how often, at most, each worker process runs the retention pass; `0` turns it off"
        ),
    )
    retention_batch_size: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="rows the retention pass deletes per transaction",
    )
    gc_interval_seconds: float = Field(
        default=3600,
        ge=0,
        description=(
            "how often, at most, each worker process collects garbage (test images past the "
            "budget, runner images of old digests, what crashed builds left); the first pass "
            "comes one interval after the start; `0` turns image collection off (crashed "
            "builds' scratch directories are still removed at every worker start)"
        ),
    )
    test_image_budget_bytes: int = Field(
        default=10 * 1024 * MIB,
        ge=0,
        description=(
            "disk (bytes of their own layers) the `gate-test:*` images of one Docker engine "
            "may hold; past it the least recently used go first"
        ),
    )
    gc_grace_seconds: float = Field(
        default=3600,
        ge=0,
        description=(
            "images built or used more recently than this are never collected (a build's "
            "leftovers also wait out `GATE_BUILD_TIMEOUT_SECONDS`)"
        ),
    )

    # Case containers; the runner's own timeout_s applies inside these limits.
    case_memory_mb: int = Field(
        default=512, description="memory (and swap) limit per case container"
    )
    case_cpus: float = Field(default=1.0, description="CPU limit per case container")
    case_pids_limit: int = Field(
        default=256,
        ge=16,
        description=(
            "processes and threads per case container (its pids limit); under gVisor "
            "(`GATE_CASE_RUNTIME=runsc`) the case's code has `GATE_CASE_GVISOR_TASKS` and the "
            "container the host tasks those cost"
        ),
    )
    case_gvisor_tasks: int = Field(
        default=16,
        ge=4,
        le=64,
        description=(
            "processes and threads a case's code may have at once under gVisor (a case "
            "runtime named `runsc` or `runsc-*`), held by gVisor's own kernel per user "
            "(`RLIMIT_NPROC`, the invocation's uid and root's each): on gVisor's ptrace "
            "platform each process costs host threads for each of gVisor's, so the container's "
            'host pids limit is 4 n² + 64 (docs/threat-model.md, "Under gVisor")'
        ),
    )
    case_tmpfs_mb: int = Field(
        default=64, description="size of the writable `/tmp` in a case container"
    )
    # A case container's hard deadline is runs * (timeout_s + min(timeout_s, 120) + 5) plus
    # this: each invocation's own limit, its builder cleanup's budget and 5 s to fork and
    # judge it (worker/handler.py), then the container's start and the verdict's writing.
    case_deadline_slack_seconds: int = Field(
        default=60,
        description=(
            "a case container's hard deadline = runs * (timeout_s + min(timeout_s, 120) + 5) "
            "+ this: per invocation its `timeout_s`, its builder cleanup's budget and 5 s to "
            "fork and judge it; at most the time left of the gate's deadline"
        ),
    )
    case_output_limit_bytes: int = Field(
        default=32 * MIB, description="container output kept (the tail)"
    )
    case_invocation_output_limit_bytes: int = Field(
        default=8 * MIB,
        ge=1024,
        description=(
            "stdout and stderr one invocation may print; past it the rest is dropped and the "
            'invocation fails: "printed more than N bytes; the rest was dropped"'
        ),
    )
    max_stored_run_bytes: int = Field(
        default=MIB,
        ge=MIN_STORED_RUN_BYTES,
        description=(
            "bytes one run may store: the JSON text of its input, output, error, reasons, "
            "failed assertions, run context, every span (keys included) and its shared values "
            "(at least 4096); past it the longest strings are cut first, each cut marked `…[N "
            "bytes cut]`, and the run's `failure_reason` says so"
        ),
    )
    case_env: str = Field(
        default="",
        description=(
            "comma-separated variables passed from the worker to the invocations of case "
            "containers (never the runner's own process), where every tool of the bundle can "
            "read them: provider keys belong in project secrets, which the model gateway "
            "keeps out of cases; a name a secret may not have (`GATE_*`, `LD_*`, `PYTHON*`, "
            "…) stops the service at start-up, naming the rule"
        ),
    )
    case_network: str = Field(
        default="none",
        description=(
            "the case containers' network policy: `none` (the default) cuts them off (live "
            "models need no network: they go through the model gateway's socket); another "
            "value names a network the operator made (a Docker network on the Docker "
            "backend); `host` and `container:…` are refused at start-up. Any other gives "
            "every tool of every bundle that network's reach: every host listener bound to "
            "0.0.0.0 through each of the host's addresses (every bridge's gateway, not only "
            "that network's), on the compose network Postgres, the API and the workers, and "
            "cloud metadata where the host reaches it"
        ),
    )

    model_gateway: bool = Field(
        default=True,
        description=(
            "serve live cases' model calls from each worker's model gateway (see [Live "
            "models](live-models.md)); `false`: no channel and no LiteLLM import in the "
            "worker, and a gate with a live agent ends `error` in validating saying so "
            "(scripted and replay cases run as ever)"
        ),
    )
    # The model gateway (gate_service/gateway): budgets per gate and per project; 0 = no limit.
    gateway_socket_root: Path | None = Field(
        default=None,
        description=(
            "host folder under which the model gateway makes each live case's channel folder "
            "(mode `0755`, its Unix socket `model.sock` `0666`: the channel's token is the "
            "credential); a socket path must stay under 108 bytes"
        ),
        json_schema_extra={"shown_default": "`$TMPDIR/gate-gateway`"},
    )
    gateway_gate_max_calls: int = Field(
        default=1000,
        ge=0,
        description=(
            "model calls one gate may make through its worker's gateway; one more fails with "
            "a `budget` model error naming `gate.calls`; `0`: no limit"
        ),
    )
    gateway_gate_max_tokens: int = Field(
        default=2_000_000,
        ge=0,
        description=(
            "tokens (prompt + completion) one gate's calls may use; checked before each call "
            "against what is spent, so the call that crosses it is answered and the next one "
            "fails (`gate.tokens`); `0`: no limit"
        ),
    )
    gateway_gate_max_cost_usd: float = Field(
        default=0.0,
        ge=0,
        description=(
            "dollars one gate's calls may cost, priced by LiteLLM's cost map (a model it does "
            "not know costs 0), checked like tokens (`gate.cost_usd`); `0`: no limit"
        ),
        json_schema_extra={"shown_default": "`0`"},
    )
    gateway_gate_max_concurrent_calls: int = Field(
        default=0,
        ge=0,
        description=(
            "calls of one gate in flight at once; one more waits for a place (a case's "
            "verdict must not depend on what ran beside it), and fails as a `deadline` model "
            "error naming `gate.concurrent_calls` only at the gate's deadline; `0`: none of "
            "its own, so a gate's live cases overlap as far as the worker's container slots "
            "and its project's limit below allow"
        ),
        json_schema_extra={"shown_default": "`0`"},
    )
    gateway_project_max_calls: int = Field(
        default=0,
        ge=0,
        description=(
            "model calls one project may make per `GATE_GATEWAY_PROJECT_WINDOW_SECONDS`, "
            "counted in Postgres across every worker (`project.calls`); `0`: no limit"
        ),
    )
    gateway_project_max_tokens: int = Field(
        default=0,
        ge=0,
        description=(
            "tokens of one project per window, across every worker (`project.tokens`); `0`: "
            "no limit"
        ),
    )
    gateway_project_max_cost_usd: float = Field(
        default=0.0,
        ge=0,
        description=(
            "dollars of one project per window, across every worker (`project.cost_usd`); "
            "`0`: no limit"
        ),
        json_schema_extra={"shown_default": "`0`"},
    )
    gateway_project_max_concurrent_calls: int = Field(
        default=32,
        ge=0,
        description=(
            "calls of one project in flight at once in one worker process; one more waits, as "
            "for a gate's (`project.concurrent_calls`); `0`: no limit. What one project's key "
            "is asked at once: a key on a provider's low rate-limit tier wants fewer (a 429 is "
            "tried again after its `Retry-After`, within the agent's tries)"
        ),
    )
    gateway_project_window_seconds: float = Field(
        default=86400,
        ge=0,
        description=(
            "how long a project's call, token and cost counts run before they start again "
            "(windows aligned to the epoch, the same for every worker); `0`: never"
        ),
    )
    gateway_retry_backoff_seconds: float = Field(
        default=1.0,
        ge=0,
        description=(
            "first wait before the gateway retries a provider error that names no "
            "`Retry-After` (doubled each try, at most 30 s); a 429's `Retry-After` is waited "
            "as it says; no retry beyond the agent's `retry_options.attempts` or past the "
            "gate's deadline"
        ),
    )

    # Tokens
    bootstrap_token: SecretStr | None = Field(
        default=None,
        description=(
            "start-up makes sure project `default` exists with this admin token (compose, CI, "
            "first use); unset, the first start creates one, prints it once and writes it "
            "`0600` to `GATE_DATA_DIR/admin-token` (`gate admin token-path` prints where)"
        ),
    )
    auth_failure_limit: int = Field(
        default=20,
        ge=1,
        description="failed authentications from one client within the window before it gets `429`",
    )
    auth_failure_window_seconds: int = Field(default=60, ge=1, description="that window")
    auth_failure_audit_limit: int = Field(
        default=100,
        ge=1,
        description=(
            "`token.rejected` audit rows one API process writes per window; past it refusals "
            "are counted, and the next row written carries `suppressed`: how many were left "
            "out"
        ),
    )
    trusted_proxies: str = Field(
        default="",
        description=(
            "comma-separated addresses or networks (`10.0.0.0/8`) of reverse proxies whose "
            "`X-Forwarded-For` and `X-Forwarded-Proto` are believed; empty: none, and the "
            "failure brake counts the connecting peer"
        ),
    )

    # Secrets
    secrets_key: SecretStr | None = Field(
        default=None,
        description=(
            "Fernet key (`python3 -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())'`) that encrypts project secrets at rest; "
            "unset, one is made on first start and kept `0600` in "
            "`GATE_DATA_DIR/secrets.key`. The API and every worker must hold the same key: "
            "set it on each when they run on different hosts (compose does); a worker with "
            'another key ends gates `error`: "cannot decrypt secret NAME of project P: '
            'GATE_SECRETS_KEY differs from the one it was stored with"'
        ),
    )

    # Intake
    upload_limit_bytes: int = Field(default=25 * MIB, description="largest accepted upload")
    long_poll_max_seconds: int = Field(default=60, description="cap on `?wait=`")
    long_poll_settle_seconds: float = Field(
        default=0.5,
        ge=0,
        le=10,
        description=(
            "a `?wait=` long-poll woken by a change of a gate that has not ended gathers "
            "further changes for up to this long into one answer; the gate's end is answered "
            "at once; `0`: every change is answered as it comes"
        ),
    )

    # Admission control: every cap answers at once (429, 503, or the gate ends `error`).
    max_queued_gates_per_project: int = Field(
        default=20,
        ge=1,
        description=(
            "gates of one project waiting for a worker; one more is `429` with `Retry-After`"
        ),
    )
    max_bundle_bytes_per_project: int = Field(
        default=1024 * MIB,
        ge=1,
        description=(
            "bytes of the distinct bundles one project's gates reference; a new bundle past "
            "it is `429` until retention deletes old gates"
        ),
    )
    max_result_bytes_per_project: int = Field(
        default=10 * 1024 * MIB,
        ge=1,
        description=(
            'bytes of stored run results (each run\'s `stored_bytes`, see "Stored results" in '
            "[the API](api.md)) one project's gates hold; a submission past it is `429` until "
            "retention deletes old gates, and meanwhile a run of a gate already admitted "
            "keeps at most 4,096 bytes"
        ),
    )
    max_running_gates_per_project: int = Field(
        default=2,
        ge=1,
        description=(
            "gates of one project judged at once; workers leave its other jobs queued and "
            "take other projects'"
        ),
    )
    max_queued_gates: int = Field(
        default=500,
        ge=1,
        description=(
            "gates waiting for a worker across all projects; one more is `503` with `Retry-After`"
        ),
    )
    max_cases_per_gate: int = Field(
        default=500,
        ge=1,
        description="cases one gate may select (after `filter`); more end it `error` in validating",
    )
    gate_deadline_seconds: int = Field(
        default=3600,
        ge=1,
        description=(
            "time a gate may take from its start (retries included); past it the gate ends "
            "`error`, and no case container is given longer than the time left"
        ),
    )
    max_concurrent_uploads: int = Field(
        default=8,
        ge=1,
        description=(
            "uploads one API process receives at once; one more is `503` with `Retry-After`"
        ),
    )
    max_concurrent_long_polls: int = Field(
        default=1000,
        ge=1,
        description=(
            "`?wait=` requests one API process holds at once; one more is `503` with `Retry-After`"
        ),
    )
    # A project's share of the two above, so that one project cannot take every slot.
    max_concurrent_uploads_per_project: int | None = Field(
        default=None,
        ge=1,
        description=(
            "uploads one project may have in progress at once in one API process (its share, "
            "so one project can never hold every slot); one more is `429` with `Retry-After`"
        ),
        json_schema_extra={"shown_default": "half of `GATE_MAX_CONCURRENT_UPLOADS`, at least 1"},
    )
    max_concurrent_long_polls_per_project: int | None = Field(
        default=None,
        ge=1,
        description=(
            "`?wait=` requests one project may have held at once in one API process; one more "
            "is `429` with `Retry-After`"
        ),
        json_schema_extra={"shown_default": "half of `GATE_MAX_CONCURRENT_LONG_POLLS`, at least 1"},
    )
    upload_min_bytes_per_second: int = Field(
        default=16 * 1024,
        ge=0,
        description=(
            "slowest an upload's body may arrive (`POST /v1/gates` and the connic test-runs "
            "route): fewer than this rate * `GATE_UPLOAD_RATE_GRACE_SECONDS` bytes in any "
            "such stretch of it, the first included, and it is cut with `408`, freeing its "
            "slot; `0`: no minimum"
        ),
    )
    upload_rate_grace_seconds: float = Field(
        default=10,
        gt=0,
        description=(
            "the stretch that minimum is measured over; the first one is an upload's grace period"
        ),
    )

    # Baselines (gate_service/baselines): history, regressions, flakiness, early stop.
    history_gates: int = Field(
        default=20,
        ge=1,
        le=200,
        description=(
            "a case's history is read over its last this many judged gates with the same "
            "closure hash (its pass rate, Wilson interval and flakiness)"
        ),
    )
    regression_p: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description=(
            "a case regressed against the baseline when the one-sided Fisher exact test's "
            "p-value is below this, and the next two hold too"
        ),
    )
    regression_min_drop: float = Field(
        default=30,
        ge=0,
        le=100,
        description="a regression's least drop of the pass rate, in percentage points",
    )
    regression_min_baseline: float = Field(
        default=70,
        ge=0,
        le=100,
        description="a regression's least baseline pass rate, in percent",
    )
    likely_regression_p: float = Field(
        default=0.20,
        gt=0,
        lt=1,
        description=(
            "a likely regression (a warning, never a failure): a p-value below this and a drop "
            "of at least `GATE_LIKELY_REGRESSION_MIN_DROP` points"
        ),
    )
    likely_regression_min_drop: float = Field(
        default=15,
        ge=0,
        le=100,
        description="a likely regression's least drop of the pass rate, in percentage points",
    )
    flaky_clear_passes: int = Field(
        default=5,
        ge=1,
        description=(
            "a flaky case (its verdicts differ across gates with one closure hash) clears after "
            "this many consecutive passing gates"
        ),
    )
    early_stop: bool = Field(
        default=True,
        description=(
            "with `runs > 1`, a case's remaining invocations are not started once its verdict "
            "can no longer change (see docs/baselines.md); `false` always runs every invocation"
        ),
    )
    wilson_max_runs: int = Field(
        default=30,
        ge=1,
        le=100,
        description=(
            "with a project's `verdict_rule: wilson`, a case whose interval still holds its "
            "threshold after its runs gets more invocations, up to this many in all"
        ),
    )
    max_quarantine_days: int = Field(
        default=90,
        ge=1,
        description="the longest a quarantine may last; every quarantine names its end",
    )

    # Observability
    log_format: LogFormat = Field(
        default=LogFormat.text,
        description=(
            "`json` writes one JSON object per line (time, level, logger, message, and "
            "`gate_id`, `case_id`, `case`, `worker` where known); `text` one human line"
        ),
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description=(
            "bearer token that may read `/metrics` (for Prometheus' `bearer_token_file`); "
            "admin tokens of project `default` may read it too"
        ),
    )
    worker_metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description=(
            "port where a standalone `gate worker` serves its own `/metrics` (durations, "
            "container starts, image cache, reaped containers; no token, no project names); "
            "`0`: none"
        ),
    )
    worker_metrics_host: str = Field(
        default="0.0.0.0",
        description="address `GATE_WORKER_METRICS_PORT` listens on",
    )

    @field_validator("case_env")
    @classmethod
    def _case_env_names(cls, value: str) -> str:
        # The same rule as a project secret's name (gate_runner/case_env.py), at start-up.
        for name in (n.strip() for n in value.split(",")):
            why = refusal(name) if name else None
            if why:
                raise ValueError(f"GATE_CASE_ENV names {name!r}: {why}")
        return value

    @field_validator("case_runtime")
    @classmethod
    def _runtime_or_default(cls, value: str | None) -> str | None:
        # Empty (compose's `${GATE_CASE_RUNTIME:-}`) is unset: the engine's default runtime.
        return (value or "").strip() or None

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

    def case_container_limit(self, runtime: str | None = None) -> int:
        """GATE_MAX_CASE_CONTAINERS, or when 0 what the machine allows: half its memory at
        GATE_CASE_MEMORY_MB each, at least GATE_CASE_CONCURRENCY, at most 256; and never more
        than a quarter of its pid_max holds at each one's pids limit (containers_pids_hold).
        ``runtime``: the one its cases run under (the sandbox's), else GATE_CASE_RUNTIME."""
        if self.max_case_containers:
            return max(self.max_case_containers, self.case_concurrency)
        fits = self.containers_memory_holds()
        if fits is None:
            return self.case_concurrency
        limit = max(self.case_concurrency, min(fits, MAX_AUTO_CASE_CONTAINERS))
        pids = self.containers_pids_hold(runtime)
        return limit if pids is None else min(limit, pids)

    def case_guest_tasks(self, runtime: str | None = None) -> int | None:
        """RLIMIT_NPROC for a case's code: GATE_CASE_GVISOR_TASKS under gVisor, else None.

        Only under gVisor: its kernel counts a user's tasks per sandbox, while the host's
        counts them per uid across the machine, and every case's code runs as the same uid.
        ``runtime``: the one its cases run under (the sandbox's), else GATE_CASE_RUNTIME.
        """
        return self.case_gvisor_tasks if is_gvisor(runtime or self.case_runtime) else None

    def case_host_pids(self, runtime: str | None = None) -> int:
        """A case container's pids limit, in host tasks.

        Under gVisor's ptrace platform each guest address space has a host thread for each
        of gVisor's own, so a case's host tasks grow as the square of its guest tasks: a
        fork bomb held at 4 guest tasks peaked at about 100 host ones here, at 8 at 240, 16
        at 700, 32 at 2,150. Below that, gVisor's kernel itself cannot start a thread and
        dies, and the case ends `error` where it should end `failed`.
        """
        guest = self.case_guest_tasks(runtime)
        if guest is None:
            return self.case_pids_limit
        return max(self.case_pids_limit, gvisor_host_tasks(guest))

    def containers_pids_hold(self, runtime: str | None = None) -> int | None:
        """Case containers at their pids limit that a quarter of the host's pid_max holds, at
        least one: pids are one table for the whole machine, so cases that filled it would
        stop every process on it from forking, and a project under its fair share may take
        up to twice a worker's slots for a while (worker/slots.py). None where pid_max is not
        known."""
        pid_max = machine_pid_max()
        if pid_max is None:
            return None
        return max(1, pid_max // 4 // self.case_host_pids(runtime))

    def containers_memory_holds(self) -> int | None:
        """Case containers of GATE_CASE_MEMORY_MB each that half the machine's memory holds;
        None where the memory is not known."""
        memory = machine_memory_bytes()
        return None if memory is None else memory // 2 // (self.case_memory_mb * MIB)

    def case_env_names(self) -> list[str]:
        """GATE_CASE_ENV's names; a refused one is left out even where validation was skipped."""
        names = (n.strip() for n in self.case_env.split(","))
        return [name for name in names if name and refusal(name) is None]

    def runtime_dir(self) -> Path:
        path = self.data_dir.expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def admin_token_path(self) -> Path:
        """The file a first start keeps the admin token it made in: GATE_DATA_DIR/admin-token,
        absolute. The start-up notice names it and `gate admin token-path` prints it; nothing
        is created here."""
        return self.data_dir.expanduser().absolute() / ADMIN_TOKEN_FILE
