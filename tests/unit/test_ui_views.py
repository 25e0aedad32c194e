"""What the results pages show, shaped from the API's views (gate_service/ui/views.py)."""

from __future__ import annotations

from gate_runner.contract import Span
from gate_service.client.model_requests import MessageText
from gate_service.ui.views import (
    MAX_TRACE_DEPTH,
    RequestView,
    ToolView,
    TraceNode,
    duration,
    is_short,
    trace_tree,
)


def span(span_id: str, parent: str | None, order: int, **metadata: object) -> Span:
    return Span(
        span_id=span_id,
        parent_span_id=parent,
        span_order=order,
        type="tool_call",
        name=span_id,
        status="ok",
        duration_ms=order,
        metadata=dict(metadata),
    )


def flat(nodes: list[TraceNode]) -> list[str]:
    out: list[str] = []
    stack = list(reversed(nodes))
    while stack:
        node = stack.pop()
        out.append(node.span.span_id)
        stack.extend(reversed(node.children))
    return out


def test_spans_nest_under_their_parents_in_span_order() -> None:
    spans = [span("s3", "s1", 3), span("s1", None, 1), span("s2", "s1", 2), span("s4", "s2", 4)]
    (root,) = trace_tree(spans)
    assert root.span.span_id == "s1"
    assert [c.span.span_id for c in root.children] == ["s2", "s3"]
    assert [c.span.span_id for c in root.children[0].children] == ["s4"]


def test_orphans_self_parents_and_cycles_are_shown_once_each() -> None:
    spans = [
        span("a", None, 1),
        span("orphan", "missing", 2),
        span("self", "self", 3),
        span("c1", "c2", 4),
        span("c2", "c1", 5),
    ]
    shown = flat(trace_tree(spans))
    assert sorted(shown) == sorted(s.span_id for s in spans)  # none lost, none twice


def test_nesting_past_the_cap_is_listed_flat_under_the_last_level() -> None:
    chain = [span(f"d{i}", f"d{i - 1}" if i else None, i) for i in range(MAX_TRACE_DEPTH + 50)]
    (root,) = trace_tree(chain)
    depth, node = 0, root
    while node.children and not node.flattened:
        node, depth = node.children[0], depth + 1
    assert node.flattened and depth == MAX_TRACE_DEPTH - 1
    assert len(node.children) == 50 and all(not c.children for c in node.children)
    assert len(flat([root])) == len(chain)


def test_a_mocked_model_free_tool_call_and_a_model_calls_facts() -> None:
    tool = TraceNode(span("t", None, 1, mocked=True))
    assert tool.mocked and tool.facts == ["mocked"]
    model = TraceNode(
        Span(
            span_id="m",
            parent_span_id=None,
            span_order=1,
            type="model_call",
            name="openai/gpt-4o",
            status="ok",
            duration_ms=5,
            metadata={"mode": "live", "tokens_in": 12, "tokens_out": 3, "cost_usd": 0.00042},
        )
    )
    assert model.facts == ["live", "tokens 12 in / 3 out", "$0.0004200"]


def test_durations_and_inline_values_read_plainly() -> None:
    assert [duration(None), duration(64), duration(8100), duration(125_000)] == [
        "—",
        "64 ms",
        "8.1 s",
        "2 min 5 s",
    ]
    assert is_short("lookup") and is_short(3) and not is_short("a\nb") and not is_short({"a": 1})


def model_span(**metadata: object) -> Span:
    return Span(
        span_id="m",
        parent_span_id=None,
        span_order=1,
        type="model_call",
        name="openai/gpt-4o",
        status="ok",
        duration_ms=5,
        metadata=dict(metadata),
    )


def test_a_model_calls_request_reads_as_prompt_messages_tools_and_format() -> None:
    request = {
        "system_prompt": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "see"},
                                         {"type": "file", "file": {"filename": "a.png"}}]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "look", "arguments": '{"q": 1}'}}, "odd"]},
            {"role": "tool", "name": "look", "content": "found"},
            ["not", "a", "message"],
        ],
        "messages_dropped": 2,
        "tools": [{"name": "look", "description": "Looks.", "parameters": {"type": "object"}},
                  {"name": "bare"}, "odd"],
        "response_format": None,
    }  # fmt: skip
    assert TraceNode(model_span(request=request)).request == RequestView(
        summary="request: 6 messages (2 not kept), 3 tools",
        system_prompt="Be brief.",
        messages=[
            MessageText("user", "see\n[file a.png]"),
            MessageText("assistant", '→ look({"q": 1})\n→ odd'),
            MessageText("tool look", "found"),
            MessageText("?", '["not", "a", "message"]'),
        ],
        messages_dropped=2,
        tools=[
            ToolView("look", "Looks.", {"type": "object"}),
            ToolView("bare", None, None),
            ToolView("odd", None, None),
        ],
        tool_schemas_dropped=False,
        response_format=None,
        omitted=None,
    )
    # Not the runner's shape, or not a model span: its metadata shows as any other.
    assert TraceNode(model_span(request="text")).request is None
    assert TraceNode(span("t", None, 1, request={"messages": []})).request is None
    counted = TraceNode(model_span(request={"messages_dropped": -1, "omitted": 7}))
    assert counted.request is not None
    assert counted.request.summary == "request: 0 messages, 0 tools (content not kept)"
    assert counted.request.omitted == "7"
