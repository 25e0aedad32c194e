"""The support table (gate_service/bundles/support.py) covers every agent field, predefined
tool and guardrail type the SDK has, docs/support.md shows it as it is, and a bundle whose agents
use a partial or not-in-a-gate item gets a warning naming file, agent and key (issue 21,
item 1)."""

from __future__ import annotations

import re
from pathlib import Path

import connic.tools
from connic.core import BUILTIN_GUARDRAIL_TYPES, AgentConfig
from connic.loader import PREDEFINED_TOOL_ALIASES, PREDEFINED_TOOL_NAMES

from gate_service.bundles import support
from gate_service.bundles.suites import validate_project
from tests.fixtures.projects import write

SUPPORT_PAGE = Path(__file__).resolve().parents[2] / "docs" / "support.md"
# The gate's own discovery pair, offered with discoverable tools (no SDK stub).
DISCOVERY = {"search_tools", "use_tool"}


def test_every_field_of_the_sdks_agent_config_is_in_the_table_in_its_order() -> None:
    # A field a later SDK release adds fails here until the table says what a gate does.
    assert list(support.AGENT_FIELDS) == list(AgentConfig.model_fields)


def test_every_predefined_tool_and_guardrail_type_of_the_sdk_is_in_the_table() -> None:
    sdk_tools = set(PREDEFINED_TOOL_NAMES) | set(PREDEFINED_TOOL_ALIASES) | DISCOVERY
    sdk_tools |= set(connic.tools.__all__)
    assert set(support.PREDEFINED_TOOLS) == sdk_tools
    assert set(support.GUARDRAIL_TYPES) == set(BUILTIN_GUARDRAIL_TYPES)


def test_each_partial_or_missing_item_says_what_differs_or_why() -> None:
    tables = (support.AGENT_FIELDS, support.PREDEFINED_TOOLS, support.GUARDRAIL_TYPES)
    for table in tables:
        for name, item in table.items():
            assert item.status in ("supported", "partial", "not_in_gate"), name
            assert len(item.note) >= 10, name


def test_the_readme_shows_the_table_as_the_code_has_it() -> None:
    text = SUPPORT_PAGE.read_text(encoding="utf-8")
    found = re.search(r"<!-- support-table:[^\n]*-->\n(.*?)<!-- /support-table -->", text, re.S)
    assert found is not None, "docs/support.md has no support table"
    assert found.group(1) == support.markdown_table()


AGENTS = {
    "agents/plain.yaml": """
        version: "1.0"
        name: plain
        description: Only what a gate runs as the platform does.
        model: openai/gpt-4o
        system_prompt: Be brief.
        temperature: 0.2
        max_iterations: 5
        guardrails: {input: [{type: regex, config: {patterns: [{pattern: x}]}}]}
    """,
    "agents/fancy.yaml": """
        version: "1.0"
        name: fancy
        description: Uses what a gate does not run as the platform does.
        model: openai/gpt-4o
        system_prompt: Be brief.
        fallback_model: openai/gpt-4o-mini
        session: true
        database: {collections: [orders]}
        tools: ["web_browser_o*", "api:billing.get_invoice"]
        guardrails:
          input: [{type: prompt_injection}]
          output: [{type: pii_leakage}]
    """,
    "tests/plain.yaml": """
        tests:
          - name: answers
            payload: hi
            expected_result: output != null
    """,
}


def test_a_bundle_gets_a_warning_per_agent_and_key_it_cannot_honour(tmp_path: Path) -> None:
    report = validate_project(write(tmp_path / "p", AGENTS))
    assert report.problems == []
    keys = [(w["file"], w["agent"], w["key"], w["support"]) for w in report.warnings]
    assert keys == [
        ("agents/fancy.yaml", "fancy", "session", "partial"),
        ("agents/fancy.yaml", "fancy", "database", "not_in_gate"),
        ("agents/fancy.yaml", "fancy", "tools.api:", "not_in_gate"),
        # The wildcard as the SDK's loader expands it.
        ("agents/fancy.yaml", "fancy", "tools.web_browser_observe", "not_in_gate"),
        ("agents/fancy.yaml", "fancy", "tools.web_browser_open", "not_in_gate"),
        # Judged by the project's guardrail model, or skipped: partial either way.
        ("agents/fancy.yaml", "fancy", "guardrails.input.prompt_injection", "partial"),
    ]
    first = report.warnings[0]["message"]
    assert first == f"session is partial: {support.AGENT_FIELDS['session'].note}"


def test_issue_39_rows_say_what_a_gate_decided() -> None:
    # Sessions are per invocation, and the warning says so; a run timeout_s stops still
    # gets its middleware cleanup; an OAuth server's connect_tool is offered.
    raw = {
        "name": "a",
        "session": {"key": "context.user"},
        "timeout": 30,
        "retry_options": {"attempts": 2},
        "mcp_servers": [
            {"name": "crm", "url": "https://crm.example/mcp", "oauth": {"connect_tool": True}}
        ],
    }
    messages = {w["key"]: w["message"] for w in support.agent_warnings("agents/a.yaml", raw, {})}
    assert "kept per invocation" in messages["session"]
    assert "invocations never share one" in messages["session"]
    assert "middleware cleanup still runs" in messages["timeout"]
    assert "connect_tool" in messages["mcp_servers.crm"]
    # One rule for attempts (runtime/retries.py), and a scripted respond() that raises counts.
    retries = messages["retry_options"]
    assert "without retry_options a model request gets 3 attempts and an operation 1" in retries
    assert "a scripted respond() that raises is asked again at once" in retries


def test_a_case_using_the_mcp_mock_ladder_is_warned_as_a_gate_extension(tmp_path: Path) -> None:
    # Decided (issue 39): spec 8.2 mocks custom file tools only; mock_mcp_* is the gate's own.
    files = {
        "agents/plain.yaml": AGENTS["agents/plain.yaml"],
        "tests/mocks/mcp_mocks.py": """
            def mock_mcp_orders_lookup(tool_name, params, context):
                return "shipped"


            async def mock_mcp(tool_name, params, context):
                return None
        """,
        "tests/mocks/plain_mocks.py": """
            def mock(tool_name, params, context):
                return 1
        """,
        "tests/plain.yaml": """
            tests:
              - name: mocked
                payload: hi
                mocks: mcp_mocks
              - name: mocked_again
                payload: hi
                mocks: mcp_mocks
              - name: plainly_mocked
                payload: hi
                mocks: plain_mocks
        """,
    }
    report = validate_project(write(tmp_path / "p", files))
    assert report.problems == []
    (warning,) = [w for w in report.warnings if w["key"] == support.MCP_MOCKS_KEY]
    assert (warning["file"], warning["agent"], warning["support"]) == (
        "tests/mocks/mcp_mocks.py",
        "plain",
        "partial",
    )
    assert warning["message"].endswith("(mock_mcp, mock_mcp_orders_lookup)")
    assert "gate extension" in warning["message"]


def test_output_schema_is_supported_and_warns_no_gate() -> None:
    # Issue 38, item 1: sent to the model as response_format, the answer checked against
    # the whole schema.
    assert support.AGENT_FIELDS["output_schema"].status == "supported"
    raw = {"name": "a", "output_schema": "answer"}
    keys = [w["key"] for w in support.agent_warnings("agents/a.yaml", raw, {})]
    assert "output_schema" not in keys


def test_the_judged_guardrail_types_say_when_they_run_and_what_may_differ() -> None:
    # Issue 38, item 6: judged by the project's guardrail model, skipped without one.
    from gate_runner.guardrails import JUDGED_TYPES

    assert set(JUDGED_TYPES) <= set(support.GUARDRAIL_TYPES)
    for kind in JUDGED_TYPES:
        row = support.GUARDRAIL_TYPES[kind]
        assert row.status == "partial", kind
        for said in (
            "PUT /v1/projects/{name}/guardrail-model",
            "live and record mode",
            "recordings in replay",
            "skipped",
            "scripted",
            "the platform's own check may judge the same text differently",
        ):
            assert said in row.note, (kind, said)
    assert "topics of the rule's config" in support.GUARDRAIL_TYPES["topic_restriction"].note
