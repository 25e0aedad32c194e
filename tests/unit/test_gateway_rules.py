"""The gateway's pure rules: which secrets a model's call uses, and how budgets count."""

from __future__ import annotations

import socket

import pytest

from gate_service.config import Settings
from gate_service.endpoints import endpoint_problem, refused_address
from gate_service.gateway import (
    PROVIDERS,
    Budget,
    BudgetLedger,
    Failure,
    Limits,
    ModelRoute,
    resolve_route,
)
from gate_service.gateway.keys import NO_KEY


def test_each_prefix_takes_its_key_and_endpoint_from_the_secrets() -> None:
    secrets = {"OPENAI_API_KEY": "sk-o", "OPENAI_API_BASE": "http://o/v1", "GEMINI_API_KEY": "g"}
    route = resolve_route("openai/gpt-4o", secrets)
    assert (route.model, route.api_key, route.api_base) == ("openai/gpt-4o", "sk-o", "http://o/v1")
    route = resolve_route("gemini/gemini-1.5-pro", secrets)
    assert (route.api_key, route.api_base, route.via) == ("g", None, "GEMINI_API_KEY")


def test_azure_needs_its_endpoint_and_passes_its_version() -> None:
    with pytest.raises(Failure) as refused:
        resolve_route("azure/my-deployment", {"AZURE_API_KEY": "k"})
    assert refused.value.error.kind == "no_route"
    assert "AZURE_API_BASE" in refused.value.error.message
    route = resolve_route(
        "azure/my-deployment",
        {"AZURE_API_KEY": "k", "AZURE_API_BASE": "https://a", "AZURE_API_VERSION": "2024-06-01"},
    )
    assert (route.api_base, route.api_version) == ("https://a", "2024-06-01")


def test_a_name_without_prefix_asks_litellm_s_provider_and_an_unknown_one_is_no_route() -> None:
    route = resolve_route("gpt-4o", {"OPENAI_API_KEY": "k"}, provider_of=lambda _m: "openai")
    assert route.api_key == "k"
    with pytest.raises(Failure) as refused:
        resolve_route("nobody/model", {"OPENAI_API_KEY": "k"})
    assert refused.value.error.kind == "no_route"
    assert "no project route" in refused.value.error.message


def test_the_first_matching_route_wins_and_may_take_no_key() -> None:
    routes = [ModelRoute("local/*", "http://vllm:8000/v1"), ModelRoute("*", "http://proxy/v1")]
    route = resolve_route("local/qwen", {}, routes)
    assert (route.model, route.api_base, route.api_key) == (
        "openai/local/qwen",
        "http://vllm:8000/v1",
        NO_KEY,
    )
    assert resolve_route("anthropic/claude", {}, routes).api_base == "http://proxy/v1"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://169.254.169.254/latest", "link-local"),
        ("http://[fe80::1]:8000/v1", "link-local"),
        ("http://[::ffff:169.254.169.254]/v1", "link-local"),
        ("http://0.0.0.0:4000/v1", "unspecified"),
        ("http://[fd00:ec2::254]/v1", "cloud metadata"),  # AWS's IPv6 metadata address
        ("http://100.100.100.200/v1", "cloud metadata"),  # Alibaba's
        ("http://[64:ff9b::a9fe:a9fe]/v1", "cloud metadata"),  # NAT64 of 169.254.169.254
        ("http://[2002:a9fe:a9fe::]/v1", "cloud metadata"),  # 6to4 of it
        ("http://224.0.0.1/v1", "multicast"),
        ("ftp://proxy/v1", "http:// or https://"),
        ("proxy:4000/v1", "http:// or https://"),
        ("http:///v1", "with a host"),
        ("http://user:pw@proxy/v1", "credentials"),
        ("http://proxy/v1?key=x", "query"),
        ("http://proxy:99999/v1", "not a URL"),
        ("http://proxy:0/v1", "port 0"),
    ],
)
def test_an_endpoint_a_project_may_not_send_calls_to_says_why(url: str, says: str) -> None:
    problem = endpoint_problem(url)
    assert problem is not None and says in problem, problem


@pytest.mark.parametrize(
    "url",
    ["http://llm-proxy:4000/v1", "https://example.com/openai/v1", "http://127.0.0.1:8000/v1"],
)
def test_an_ordinary_endpoint_is_allowed(url: str) -> None:
    assert endpoint_problem(url) is None


def test_a_name_that_resolves_to_a_link_local_address_is_refused_at_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = {"metadata.internal": "169.254.169.254", "proxy.internal": "10.0.0.7"}

    def resolve(host: str, *args: object, **kwargs: object) -> list[tuple[object, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], 80))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    # Allowed when set (a name), refused when called: it points at cloud metadata.
    assert endpoint_problem("http://metadata.internal/v1") is None
    refused = refused_address("http://metadata.internal/v1")
    assert refused is not None and "169.254.169.254" in refused
    assert refused_address("http://proxy.internal/v1") is None


def test_every_provider_key_is_a_name_a_project_secret_may_have() -> None:
    from gate_runner.case_env import refusal

    names = {n for keys in PROVIDERS.values() for n in (keys.key, keys.base, keys.version) if n}
    assert {name: refusal(name) for name in names if refusal(name)} == {}


def test_the_ledger_charges_all_budgets_or_none() -> None:
    ledger = BudgetLedger()
    gate = Budget("gate", Limits(calls=5))
    project = Budget("project", Limits(calls=1))
    ledger.admit([gate, project])
    with pytest.raises(Failure) as refused:
        ledger.admit([gate, project])
    assert refused.value.error.limit == "project.calls"
    assert (gate.calls, gate.in_flight) == (1, 1)  # the refused call charged the gate nothing
    ledger.settle([gate, project], tokens=7, cost_usd=0.5)
    assert (gate.in_flight, gate.tokens, project.cost_usd) == (0, 7, 0.5)


def test_a_project_window_starts_its_counts_again() -> None:
    now = [0.0]
    budget = Budget("project", Limits(tokens=10), window_s=60, clock=lambda: now[0])
    budget.tokens = 12
    refused = budget.refusal()
    assert refused is not None
    assert refused.error.message == "project.tokens budget of 10 reached (12 used)"
    now[0] = 61.0
    assert budget.refusal() is None
    assert budget.tokens == 0


def test_the_settings_make_the_gateway_s_budgets() -> None:
    from gate_service.gateway import ModelGateway

    settings = Settings(
        gateway_gate_max_calls=3,
        gateway_project_max_cost_usd=2.5,
        gateway_project_window_seconds=0,
    )
    gateway = ModelGateway.from_settings(settings)
    assert gateway.budgets.gate.calls == 3
    assert gateway.budgets.project.cost_usd == 2.5
    assert gateway.budgets.project_window_s == 0


@pytest.mark.slow
def test_importing_the_gateway_loads_no_litellm() -> None:
    # LiteLLM costs seconds to import: a worker pays it when it builds its gateway, and
    # nothing that merely imports the package (the API, the CLI) pays it at all.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # this checkout, not an installed copy
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'runner_image'}"}
    probe = "import sys, gate_service.gateway; print('litellm' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"
    # Nor does a worker's gateway until a call needs LiteLLM (issue 43): a worker claims
    # scripted and replay gates without waiting for its import; the first live call pays it.
    probe = (
        "import sys; from gate_service.gateway import ModelGateway; g = ModelGateway(); "
        "print('litellm' in sys.modules, g.libraries_loaded); "
        "print(g.provider_of('gpt-4o'), 'litellm' in sys.modules, g.libraries_loaded)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split("\n")[:2] == ["False False", "openai True True"]


def test_a_providers_error_reaches_the_agent_with_no_part_of_a_secret_in_it() -> None:
    from types import SimpleNamespace

    from gate_runner.gateway_wire import CompletionRequest
    from gate_service.gateway import ModelGateway

    # One value inside another: replacing the shorter first would leave the longer's tail.
    channel = SimpleNamespace(secrets={"SHORT": "abcd1234", "LONG": "abcd1234efgh5678"})
    request = CompletionRequest(model="openai/gpt-4o", messages=[])
    reason = "openai answered HTTP 401: key abcd1234efgh5678 refused; abcd1234 too"
    text = ModelGateway._redacted(channel, request, reason)  # type: ignore[arg-type]
    assert "abcd1234" not in text and "efgh5678" not in text
    assert "[REDACTED:LONG]" in text and "[REDACTED:SHORT]" in text
    assert text.startswith("openai answered HTTP 401: key ")
