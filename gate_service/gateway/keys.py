"""Which key and endpoint a model call uses, from its project's secrets, never the environment.

A model name's provider prefix (``openai/gpt-4o``) names the secrets LiteLLM itself would read
from the environment (``OPENAI_API_KEY``, ``OPENAI_API_BASE``); the gateway reads them from the
project's secrets instead and passes them per call, because one worker serves several
projects at once. A project may also route model names matching a pattern to an
OpenAI-compatible endpoint of its own (its LiteLLM proxy, Azure's, a local vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from .failure import Failure


@dataclass(frozen=True, slots=True)
class ProviderKeys:
    """The secret names of one LiteLLM provider: its key, and optionally its endpoint and API
    version. ``base_required``: the provider has no default endpoint (Azure)."""

    key: str
    base: str | None = None
    version: str | None = None
    base_required: bool = False


# LiteLLM's provider prefixes and the environment names it reads for them.
PROVIDERS: Mapping[str, ProviderKeys] = {
    "openai": ProviderKeys("OPENAI_API_KEY", base="OPENAI_API_BASE"),
    "anthropic": ProviderKeys("ANTHROPIC_API_KEY", base="ANTHROPIC_API_BASE"),
    "gemini": ProviderKeys("GEMINI_API_KEY", base="GEMINI_API_BASE"),
    "azure": ProviderKeys(
        "AZURE_API_KEY", base="AZURE_API_BASE", version="AZURE_API_VERSION", base_required=True
    ),
    "mistral": ProviderKeys("MISTRAL_API_KEY", base="MISTRAL_API_BASE"),
    "groq": ProviderKeys("GROQ_API_KEY", base="GROQ_API_BASE"),
    "cohere": ProviderKeys("COHERE_API_KEY", base="COHERE_API_BASE"),
    "cohere_chat": ProviderKeys("COHERE_API_KEY", base="COHERE_API_BASE"),
    "deepseek": ProviderKeys("DEEPSEEK_API_KEY", base="DEEPSEEK_API_BASE"),
    "openrouter": ProviderKeys("OPENROUTER_API_KEY", base="OPENROUTER_API_BASE"),
    "xai": ProviderKeys("XAI_API_KEY", base="XAI_API_BASE"),
    "together_ai": ProviderKeys("TOGETHERAI_API_KEY", base="TOGETHERAI_API_BASE"),
}


def provider_secret_names() -> frozenset[str]:
    """Every secret name the gateway reads for a provider: the worker keeps these out of a
    case's environment when a gateway serves the case, so no provider key enters a case."""
    names: set[str] = set()
    for keys in PROVIDERS.values():
        names.update(n for n in (keys.key, keys.base, keys.version) if n is not None)
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Model names matching ``pattern`` (fnmatch, case-sensitive, on the whole name) go to the
    OpenAI-compatible endpoint ``api_base`` with the key in the project secret
    ``key_secret`` (None: the endpoint takes no key)."""

    pattern: str
    api_base: str
    key_secret: str | None = None
    # Its endpoint's Responses API rather than chat completions, which every
    # OpenAI-compatible endpoint serves (routes are documented as such).
    responses_api: bool = False


def route_of(stored: Mapping[str, Any]) -> ModelRoute:
    """A route as the projects table stores it (``{"pattern", "api_base", "key_secret",
    "responses_api"}``; routes stored before the last had no such key)."""
    return ModelRoute(
        pattern=str(stored["pattern"]),
        api_base=str(stored["api_base"]),
        key_secret=stored.get("key_secret"),
        responses_api=bool(stored.get("responses_api", False)),
    )


@dataclass(frozen=True, slots=True)
class Route:
    """What one call passes to ``litellm.completion`` besides the request itself."""

    model: str  # the name LiteLLM is called with (a routed one is prefixed "openai/")
    api_key: str
    api_base: str | None = None
    api_version: str | None = None
    via: str = ""  # where it came from, for messages: "OPENAI_API_KEY" or "route 'corp/*'"
    # A project route's API: "chat" (chat completions, whatever LiteLLM would choose for the
    # model's name) or "responses"; None for a provider's own endpoint (LiteLLM's choice).
    api: str | None = None


# An OpenAI-compatible endpoint that takes no key still needs one for the client library.
NO_KEY = "no-key"


def resolve_route(
    model: str,
    secrets: Mapping[str, str],
    routes: Sequence[ModelRoute] = (),
    *,
    provider_of: Callable[[str], str | None] = lambda _model: None,
) -> Route:
    """The route of a call to ``model``: the first matching project route, else the model's
    provider's secrets. ``provider_of`` names the provider of a name without a prefix
    (LiteLLM knows ``gpt-4o`` is OpenAI's). Raises ``Failure("no_route")`` naming what it
    looked for."""
    for route in routes:
        if fnmatchcase(model, route.pattern):
            key = NO_KEY
            if route.key_secret is not None:
                found = secrets.get(route.key_secret)
                if not found:
                    raise Failure(
                        "no_route",
                        f"model {model} is routed to {route.api_base} by the project's route "
                        f"{route.pattern!r}, whose key secret {route.key_secret} the project "
                        "does not have",
                        secret=route.key_secret,
                    )
                key = found
            return Route(
                model=f"openai/{model}",
                api_key=key,
                api_base=route.api_base,
                via=f"route {route.pattern!r}",
                api="responses" if route.responses_api else "chat",
            )
    prefix, slash, _ = model.partition("/")
    provider = prefix if slash else provider_of(model)
    names = PROVIDERS.get(provider or "")
    if names is None:
        known = ", ".join(sorted(PROVIDERS))
        raise Failure(
            "no_route",
            f"model {model}: the gateway knows no provider "
            f"{provider or '(none in the name)'!r} (known prefixes: {known}) and no project "
            "route matches it",
        )
    provider_key = secrets.get(names.key)
    if not provider_key:
        raise Failure(
            "no_route",
            f"model {model} needs the project secret {names.key}, which the project does not have",
            secret=names.key,
        )
    base = secrets.get(names.base) or None if names.base else None
    if names.base_required and not base:
        raise Failure(
            "no_route",
            f"model {model} needs the project secret {names.base}, which the project does not have",
            secret=names.base,
        )
    version = secrets.get(names.version) or None if names.version else None
    return Route(
        model=model, api_key=provider_key, api_base=base, api_version=version, via=names.key
    )


@dataclass(frozen=True, slots=True)
class Unrouted:
    """Why no call to ``model`` could be made with a project's secrets and routes
    (``resolve_route``'s message), and the project secret that would give it a route (None:
    no secret would, only a project route or another model name)."""

    model: str
    reason: str
    secret: str | None


def unrouted(
    model: str,
    secrets: Mapping[str, str],
    routes: Sequence[ModelRoute] = (),
    *,
    provider_of: Callable[[str], str | None] = lambda _model: None,
) -> Unrouted | None:
    """None when ``resolve_route`` finds ``model`` a route; else why not and which secret is
    missing. Checked before a gate's cases run (the worker's validating phase), with the same
    lookup every call then makes, which stays the backstop."""
    try:
        resolve_route(model, secrets, routes, provider_of=provider_of)
    except Failure as exc:
        return Unrouted(model, exc.error.message, exc.secret)
    return None
