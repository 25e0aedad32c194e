"""Every provider family through the real gateway and LiteLLM, against listeners of our own on
loopback: no model call follows a redirect (the target is never asked), a provider's failure
is a readable reason (provider, path, status, the body's first characters; no library class
name, traceback or worker path), and a key goes only to its own provider."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gate_service.gateway import ModelRoute
from tests.fixtures.gateway import Gateways, ask, moderate

Answer = Callable[[BaseHTTPRequestHandler], None]


class Listener:
    """An HTTP server on 127.0.0.1 that keeps every request (method, path, headers, body)
    and answers each with ``answer``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size).decode("utf-8", errors="replace")
                listener.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                listener.answer(self)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def saw(self, text: str) -> bool:
        """Whether ``text`` was anywhere in a request it received."""
        return any(text in json.dumps(r) for r in self.requests)


def send(status: int, body: bytes, kind: str = "application/json") -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def hang_up(handler: BaseHTTPRequestHandler) -> None:
    handler.close_connection = True
    handler.connection.shutdown(2)


def redirect_to(target: str) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(307)
        handler.send_header("Location", target + handler.path)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


CHAT = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


@pytest.fixture
def listeners() -> Iterator[Callable[[Answer], Listener]]:
    made: list[Listener] = []

    def make(answer: Answer) -> Listener:
        made.append(Listener(answer))
        return made[-1]

    try:
        yield make
    finally:
        for listener in made:
            listener.close()


# (model name, its provider's secret prefix, the provider's name in reasons): a bare OpenAI
# name LiteLLM maps to OpenAI, and every provider the gateway knows (gateway/keys.py).
FAMILIES = [
    ("gpt-4o-mini", "OPENAI", "openai"),
    ("openai/gpt-4o", "OPENAI", "openai"),
    ("anthropic/claude-3-5-sonnet-latest", "ANTHROPIC", "anthropic"),
    ("gemini/gemini-2.0-flash", "GEMINI", "gemini"),
    ("mistral/mistral-small-latest", "MISTRAL", "mistral"),
    ("groq/llama-3.1-8b-instant", "GROQ", "groq"),
    ("cohere/command-r", "COHERE", "cohere"),
    ("deepseek/deepseek-chat", "DEEPSEEK", "deepseek"),
    ("openrouter/meta/llama-3", "OPENROUTER", "openrouter"),
    ("xai/grok-2", "XAI", "xai"),
    ("together_ai/meta/llama-3", "TOGETHERAI", "together_ai"),
    ("azure/my-deployment", "AZURE", "azure"),
]
ROUTED = ("corp/llm", None, "the project's route 'corp/*'")


def _channel(gateways: Gateways, model: str, prefix: str | None, base: str, **kw: Any) -> Any:
    if prefix is None:  # a project route
        return gateways.open({}, routes=[ModelRoute("corp/*", base)], **kw)
    secrets = {f"{prefix}_API_KEY": f"key-of-{prefix.lower()}", f"{prefix}_API_BASE": base}
    if prefix == "AZURE":
        secrets["AZURE_API_VERSION"] = "2024-06-01"
    return gateways.open(secrets, **kw)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "prefix", "who"), [*FAMILIES, ROUTED])
def test_no_model_call_follows_a_redirect_whatever_the_provider(
    gateways: Gateways,
    listeners: Callable[[Answer], Listener],
    model: str,
    prefix: str | None,
    who: str,
) -> None:
    second = listeners(send(200, CHAT))
    first = listeners(redirect_to(second.url))
    channel = _channel(gateways, model, prefix, first.url)
    status, answer = ask(channel, model=model, attempts=3)
    assert status == 424, answer
    message = answer["error"]["message"]
    assert answer["error"]["kind"] == "no_route"
    assert "redirect" in message and second.url in message, message
    assert message.startswith(f"{who}: "), message
    # Asked once (a redirect is no reason for another try); its target never.
    assert len(first.requests) == 1
    assert second.requests == []


def test_a_moderation_s_redirect_is_not_followed(
    gateways: Gateways, listeners: Callable[[Answer], Listener]
) -> None:
    second = listeners(send(200, b"{}"))
    first = listeners(redirect_to(second.url))
    channel = gateways.open({"OPENAI_API_KEY": "k", "OPENAI_API_BASE": first.url})
    status, answer = moderate(channel, "hi")
    assert (status, answer["error"]["kind"]) == (424, "no_route"), answer
    assert second.requests == [] and len(first.requests) == 1


ANSWERS = {
    "empty object": (send(200, b"{}"), 200, "{}"),
    "a page": (send(200, b"<html><body>Sign in</body></html>", "text/html"), 200, "Sign in"),
    "a server error": (send(500, b'{"error": {"message": "overloaded"}}'), 500, "overloaded"),
    "a refused key": (send(401, b'{"error": {"message": "bad key"}}'), 401, "bad key"),
    "an unknown model": (send(404, b'{"error": {"message": "no such model"}}'), 404, "no such"),
    "a hang-up": (hang_up, None, None),
}
INTERNALS = ("Traceback", "litellm", "site-packages", ".py", "Exception", "Error:", "File ")


@pytest.mark.slow
@pytest.mark.parametrize("answered", list(ANSWERS))
@pytest.mark.parametrize(("model", "prefix", "who"), [*FAMILIES, ROUTED])
def test_a_provider_failure_is_a_readable_reason_with_nothing_internal(
    gateways: Gateways,
    listeners: Callable[[Answer], Listener],
    model: str,
    prefix: str | None,
    who: str,
    answered: str,
) -> None:
    respond, status_seen, excerpt = ANSWERS[answered]
    endpoint = listeners(respond)
    channel = _channel(gateways, model, prefix, endpoint.url)
    status, answer = ask(channel, model=model)
    assert (status, answer["error"]["kind"]) == (502, "provider"), answer
    message = answer["error"]["message"]
    (path,) = {r["path"].split("?")[0] for r in endpoint.requests}
    assert message.startswith(f"{who} "), message
    assert f"POST {path}" in message, message
    if status_seen is None:
        assert "could not be reached" in message, message
    else:
        assert f"HTTP {status_seen}" in message and excerpt in message, message
    for internal in INTERNALS:
        assert internal not in message, (internal, message)
    # The status the provider answered, which the runner tells the agent's failures by.
    assert answer["error"]["provider_status"] == status_seen, answer
    # Once: no prefix repeated (the runner adds "model call to <model> failed: ").
    assert message.count(" answered HTTP ") + message.count(" could not be reached ") == 1
    # What is stored for the case is the same reason.
    (record,) = channel.records
    assert record.error is not None and record.error.message == message


def test_an_answer_s_excerpt_is_at_most_300_characters_and_redacted(
    gateways: Gateways, listeners: Callable[[Answer], Listener]
) -> None:
    key = "sk-echoed-back-0001"
    endpoint = listeners(send(401, json.dumps({"bad key": key, "pad": "x" * 5000}).encode()))
    channel = gateways.open({"OPENAI_API_KEY": key, "OPENAI_API_BASE": endpoint.url})
    status, answer = ask(channel, model="openai/gpt-4o")
    message = answer["error"]["message"]
    assert (status, answer["error"]["kind"]) == (502, "provider"), answer
    assert key not in message and "[REDACTED:OPENAI_API_KEY]" in message, message
    assert "HTTP 401" in message
    excerpt = message.split("/chat/completions: ", 1)[1]
    assert len(excerpt) <= 300 + len("[REDACTED:OPENAI_API_KEY]"), len(excerpt)


def test_a_gemini_key_never_reaches_the_openai_endpoint(
    gateways: Gateways, listeners: Callable[[Answer], Listener]
) -> None:
    openai_end = listeners(send(200, CHAT))
    gemini_end = listeners(send(500, b'{"error": "no"}'))
    gemini_key, openai_key = "AIza-gemini-key-0001", "sk-openai-key-0002"
    channel = gateways.open(
        {
            "OPENAI_API_KEY": openai_key,
            "OPENAI_API_BASE": openai_end.url,
            "GEMINI_API_KEY": gemini_key,
            "GEMINI_API_BASE": gemini_end.url,
        }
    )
    # A moderation of a Gemini model is refused before anything is sent: moderation runs on
    # OpenAI's API or a route, never with another provider's key.
    status, answer = moderate(channel, "hi", model="gemini/gemini-2.0-flash")
    assert (status, answer["error"]["kind"]) == (424, "no_route"), answer
    assert "OpenAI's moderation API" in answer["error"]["message"]
    ask(channel, model="gemini/gemini-2.0-flash")
    ask(channel, model="openai/gpt-4o")
    moderate(channel, "hi")
    assert gemini_end.saw(gemini_key) and not gemini_end.saw(openai_key)
    assert openai_end.saw(openai_key) and not openai_end.saw(gemini_key)
    assert len(gemini_end.requests) == 1 and len(openai_end.requests) == 2


def _chat_or_responses(handler: BaseHTTPRequestHandler) -> None:
    send(200, CHAT)(handler)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt-5-pro", "o1-pro", "gpt-5.6-sol"])
def test_a_route_speaks_chat_completions_whatever_the_model_s_name(
    gateways: Gateways, listeners: Callable[[Answer], Listener], model: str
) -> None:
    # LiteLLM sends these names (gpt-5-pro, o1-pro always; gpt-5.6 with tools and a reasoning
    # effort) to {api_base}/responses; a route's endpoint may serve chat completions only.
    endpoint = listeners(_chat_or_responses)
    channel = gateways.open({}, routes=[ModelRoute("*", endpoint.url + "/v1")])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    status, answer = ask(
        channel, model=f"openai/{model}", tools=tools, options={"reasoning_effort": "high"}
    )
    assert status == 200, answer
    assert [r["path"] for r in endpoint.requests] == ["/v1/chat/completions"]


def test_a_route_may_opt_into_the_responses_api(
    gateways: Gateways, listeners: Callable[[Answer], Listener]
) -> None:
    endpoint = listeners(send(404, b'{"error": "no such route"}'))
    route = ModelRoute("*", endpoint.url + "/v1", responses_api=True)
    channel = gateways.open({}, routes=[route])
    status, answer = ask(channel, model="corp/llm")
    assert status == 502, answer
    assert [r["path"] for r in endpoint.requests] == ["/v1/responses"], answer
    assert "HTTP 404 to POST /v1/responses" in answer["error"]["message"]
