"""The model gateway: the one door out of a live case (docs/threat-model.md).

Each worker process builds one ``ModelGateway`` at start-up (``gateway``: LiteLLM imported
once, forwarding, retries) and opens a ``Channel`` per case (``channel``: a Unix socket in a
host folder of its own, a token only it accepts, the record of its calls). ``keys`` finds a
call's provider key among the project's secrets (or a project route), ``budget`` counts
calls, tokens, cost and concurrent calls per gate and per project (``spend`` keeps a
project's spending in Postgres, shared by every worker), ``records`` turns
recorded calls into totals and replay recordings. The wire it serves is
gate_runner/gateway_wire.py.

Imports config, db (``spend``), the runner's wire and replay key (gate_runner), and LiteLLM
(only when a gateway is built); never the worker, the CLI, the app or any HTTP-serving
module.
"""

from .budget import Budget, BudgetLedger, Budgets, Limits
from .channel import Channel
from .failure import Failure
from .gateway import ModelGateway
from .keys import (
    PROVIDERS,
    ModelRoute,
    ProviderKeys,
    Route,
    Unrouted,
    provider_secret_names,
    resolve_route,
    route_of,
    unrouted,
)
from .records import (
    RECORDINGS_DIR,
    Answered,
    CallRecord,
    Totals,
    export_recordings,
    recording_files,
    totals,
)

__all__ = [
    "PROVIDERS",
    "RECORDINGS_DIR",
    "Answered",
    "Budget",
    "BudgetLedger",
    "Budgets",
    "CallRecord",
    "Channel",
    "Failure",
    "Limits",
    "ModelGateway",
    "ModelRoute",
    "ProviderKeys",
    "Route",
    "Totals",
    "Unrouted",
    "export_recordings",
    "provider_secret_names",
    "recording_files",
    "resolve_route",
    "route_of",
    "totals",
    "unrouted",
]
