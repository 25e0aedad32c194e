"""The REST shapes of projects and their settings: model routes, egress hosts, the guardrail
model and API specs."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gate_runner.case_env import ENV_NAME

from ..endpoints import egress_problem, endpoint_problem
from ..text import StorableStr


class Schema(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    retention_days: int = Field(default=30, ge=1, le=3650)


class ProjectUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retention_days: int = Field(
        ge=1, le=3650, description="Finished gates, their runs and audit events older than this go"
    )


class ProjectRead(Schema):
    id: uuid.UUID
    name: str
    retention_days: int
    created_at: datetime
    guardrail_model: str | None = Field(
        default=None,
        description="The model that judges the project's judged guardrails "
        "(PUT /v1/projects/{name}/guardrail-model); null: none, so they are skipped",
    )
    verdict_rule: str = Field(
        default="threshold",
        description="How a case with runs > 1 is judged (PUT /v1/projects/{name}/verdict-rule): "
        "threshold or wilson",
    )


class DeletedCounts(Schema):
    """What went with a deleted project (the `project.deleted` audit event's detail too)."""

    gates: int
    gates_stopped: int = Field(description="Of the gates, those queued or running")
    cases: int
    runs: int
    model_calls: int
    jobs: int
    tokens: int
    ui_sessions: int
    secrets: int
    quarantines: int = Field(description="Quarantined cases, held or ended")
    spend_windows: int = Field(description="Windows of the project's model spending")
    audit_events: int
    bundles: int = Field(description="Bundles no other project's gate references")
    result_bytes: int = Field(description="Bytes the gates' runs and model calls stored")
    bundle_bytes: int = Field(description="Bytes of the deleted bundles")


class ProjectDeleted(Schema):
    id: uuid.UUID
    name: str
    counts: DeletedCounts


class ModelRouteSpec(BaseModel):
    """One route: model names matching ``pattern`` go to ``api_base``."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    pattern: StorableStr = Field(
        min_length=1,
        max_length=200,
        description="fnmatch pattern on the whole model name, case-sensitive: 'corp/*'",
    )
    api_base: StorableStr = Field(
        max_length=500,
        description="An OpenAI-compatible endpoint, http(s), e.g. http://llm-proxy:4000/v1. "
        "Not a link-local address; no credentials in the URL.",
    )
    key_secret: str | None = Field(
        default=None,
        max_length=128,
        description="The project secret holding the endpoint's key; none: it takes no key",
    )
    responses_api: bool = Field(
        default=False,
        description="Call the endpoint's Responses API ({api_base}/responses); by default a "
        "route is called at {api_base}/chat/completions whatever the model's name",
    )

    @field_validator("api_base")
    @classmethod
    def _callable_endpoint(cls, value: str) -> str:
        problem = endpoint_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("key_secret")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a secret name (an environment-variable name)")
        return value


# At most this many routes a project: each call tries them in order.
MAX_ROUTES = 32


class ModelRoutesPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    routes: list[ModelRouteSpec] = Field(
        max_length=MAX_ROUTES,
        description="Tried in order; the first match wins. An empty list removes them all.",
    )


class ModelRoutes(BaseModel):
    project: str
    routes: list[ModelRouteSpec]


# At most this many hosts on a project's egress allowlist.
MAX_EGRESS_HOSTS = 100


class EgressPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[StorableStr] = Field(
        max_length=MAX_EGRESS_HOSTS,
        description="Host names (api.example.com), *.domains (their subdomains) or addresses "
        "a case's web_read_page may reach through the gateway; not link-local addresses. An "
        "empty list allows none.",
    )

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            problem = egress_problem(host)
            if problem is not None:
                raise ValueError(problem)
        return hosts


class Egress(BaseModel):
    project: str
    hosts: list[str]


# A model name as the gateway takes one (``openai/gpt-4o-mini``, ``ollama/llama3:8b``,
# ``bedrock/anthropic.claude-3-haiku-20240307-v1:0``): at most the column's 200 characters,
# ASCII letters and digits and these, starting with a letter or digit. It reaches the
# runner's command line and the fixes a gate's failure reason spells out, so nothing else.
MAX_MODEL_NAME = 200
MODEL_NAME_PUNCTUATION = "._-/:@+"
_MODEL_NAME_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" + MODEL_NAME_PUNCTUATION
)


def _character(ch: str) -> str:
    code = f"U+{ord(ch):04X}"
    if ch == " ":
        return f"a space ({code})"
    return f"{ch!r} ({code})" if ch.isprintable() else f"the unprintable character {code}"


def model_name_problem(name: str) -> str | None:
    """Why ``name`` is not a model name the gate takes, or None; one pass, no pattern."""
    rule = (
        f"a model name is 1 to {MAX_MODEL_NAME} characters: ASCII letters, digits and "
        f"{' '.join(MODEL_NAME_PUNCTUATION)}, starting with a letter or digit"
    )
    if not name:
        return f"the model name is empty; {rule}"
    if len(name) > MAX_MODEL_NAME:
        return f"the model name has {len(name)} characters, more than {MAX_MODEL_NAME}; {rule}"
    if name[0] in MODEL_NAME_PUNCTUATION:
        return f"the model name starts with {name[0]!r}; {rule}"
    for at, ch in enumerate(name):
        if ch not in _MODEL_NAME_CHARS:
            return f"the model name holds {_character(ch)} at position {at + 1}; {rule}"
    return None


class GuardrailModelPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        min_length=1,
        max_length=MAX_MODEL_NAME,
        description="The judge model, as an agent's model is named ('openai/gpt-4o-mini'): "
        "through the model gateway, with a provider key among the project's secrets or a "
        "model route",
    )

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str) -> str:
        problem = model_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class GuardrailModel(BaseModel):
    project: str
    model: str | None = Field(
        description="The model that judges the prompt_injection, topic_restriction, "
        "system_prompt_leakage, data_exfiltration and relevance guardrails of the project's "
        "agents; null: none, so those guardrails are skipped and the gate warns"
    )


VerdictRuleName = Literal["threshold", "wilson"]


class VerdictRulePut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict_rule: VerdictRuleName = Field(
        description="threshold: a case passes when successes/runs reaches its "
        "success_threshold (the platform's rule); wilson: a case whose Wilson 95% interval "
        "still holds its threshold after its runs gets more invocations, up to "
        "GATE_WILSON_MAX_RUNS in all. Gates that start from then on use it"
    )


class VerdictRule(BaseModel):
    project: str
    verdict_rule: VerdictRuleName


class ApiSpecPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(
        description="An OpenAPI 3.x document (JSON); each operation becomes one api: tool"
    )
    base_url: StorableStr | None = Field(
        default=None, description="Where its operations are called; default: servers[0].url"
    )
    headers: dict[StorableStr, StorableStr] = Field(
        default_factory=dict,
        max_length=20,
        description="Sent with every call; ${NAME} is filled from the project's secrets by the "
        "gateway (never a model provider's key)",
    )


class ApiSpecRead(BaseModel):
    project: str
    prefix: str
    base_url: str
    headers: list[str] = Field(description="The names of the headers sent (values not shown)")
    tools: list[str]


class ApiSpecList(BaseModel):
    project: str
    specs: list[ApiSpecRead]
