"""Redaction of secret values: every place a value can sit in a case's result."""

from __future__ import annotations

import dataclasses

import pytest

from gate_runner.contract import CaseResult
from gate_service.runner_contract import UntrustedResult, validate_result
from gate_service.secrets.redact import MIN_REDACTED_LENGTH, Redactor, redact, redact_result

SECRETS = {"API_KEY": "sk-live-0123456789", "DB_PASSWORD": "hunter22"}


def test_strings_lists_dict_keys_and_values_are_redacted() -> None:
    value = {
        "env": {"API_KEY": "sk-live-0123456789", "HOME": "/home/u"},
        "sk-live-0123456789": ["pw=hunter22;", ("hunter22", 3)],
        "n": 7,
        "none": None,
        "flag": True,
    }
    assert redact(value, SECRETS) == {
        "env": {"API_KEY": "[REDACTED:API_KEY]", "HOME": "/home/u"},
        "[REDACTED:API_KEY]": ["pw=[REDACTED:DB_PASSWORD];", ["[REDACTED:DB_PASSWORD]", 3]],
        "n": 7,
        "none": None,
        "flag": True,
    }


def test_a_value_inside_another_is_replaced_whole_longest_first() -> None:
    secrets = {"SHORT": "abcd", "LONG": "xxabcdxx"}
    assert redact("1 xxabcdxx 2 abcd", secrets) == "1 [REDACTED:LONG] 2 [REDACTED:SHORT]"


def test_a_marker_just_written_is_not_searched_again() -> None:
    # "REDACTED" is itself a secret here; the marker for KEY must stay whole.
    secrets = {"KEY": "secret-value", "WORD": "REDACTED"}
    assert redact("secret-value REDACTED", secrets) == "[REDACTED:KEY] [REDACTED:WORD]"


def test_values_shorter_than_the_minimum_are_left_alone() -> None:
    short = "x" * (MIN_REDACTED_LENGTH - 1)
    secrets = {"DEBUG": "1", "EMPTY": "", "REGION": short, "TOKEN": "t" * MIN_REDACTED_LENGTH}
    text = f"1 {short} {'t' * MIN_REDACTED_LENGTH}"
    assert redact(text, secrets) == f"1 {short} [REDACTED:TOKEN]"
    assert not Redactor({"DEBUG": "1"})  # nothing to redact: values pass untouched


def test_regex_characters_in_a_value_are_literal() -> None:
    assert redact("a.*b a.*b axb", {"K": "a.*b"}) == "[REDACTED:K] [REDACTED:K] axb"


def test_two_names_with_one_value_get_one_stable_name() -> None:
    assert redact("same-value", {"B_NAME": "same-value", "A_NAME": "same-value"}) == (
        "[REDACTED:A_NAME]"
    )


def result_with(secret: str) -> CaseResult:
    span = {
        "span_id": "s1",
        "parent_span_id": None,
        "span_order": 0,
        "type": "log",
        "name": f"print {secret}",
        "status": "ok",
        "duration_ms": 0,
        "metadata": {"message": f"token={secret}", "nested": [{secret: secret}]},
    }
    invocation = {
        "index": 0,
        "status": secret,
        "passed": False,
        "input": {"payload": secret},
        "output": {"environ": {"API_KEY": secret}},
        "error": f"boom {secret}",
        "failure_reason": f"saw {secret}",
        "failed_assertions": [f"output == {secret}"],
        "run_context": {"k": secret},
        "duration_ms": 1,
        "traces": [span],
    }
    return validate_result(
        {
            "schema_version": 2,
            "suite": "tests/s.yaml",
            "test_name": "t",
            "agent_name": "a",
            "runs": 1,
            "success_threshold": 100,
            "successes": 0,
            "passed": False,
            "case_error": f"case {secret}",
            "failure_reason": f"first {secret}",
            "duration_ms": 1,
            "invocations": [invocation],
            "nonce": "n" * 64,
        }
    )


def test_every_field_of_a_result_is_redacted_and_field_names_survive() -> None:
    secret = SECRETS["API_KEY"]
    # A secret whose value is a field name must not rename the field.
    redactor = Redactor({**SECRETS, "ODD": "status"})
    redacted = redact_result(result_with(secret), redactor)
    dumped = redacted.to_json()
    assert secret not in dumped
    assert dumped.count("[REDACTED:API_KEY]") == 13
    inv = redacted.invocations[0]
    assert inv.status == "[REDACTED:API_KEY]"
    assert inv.traces[0].metadata["nested"] == [{"[REDACTED:API_KEY]": "[REDACTED:API_KEY]"}]
    assert inv.traces[0].status == "ok"  # not a secret's value
    assert redacted.nonce == "n" * 64


def test_a_result_too_deep_to_walk_is_not_trusted() -> None:
    result = result_with("sk-live-0123456789")
    deep: object = "sk-live-0123456789"
    for _ in range(100_000):
        deep = [deep]
    result.invocations[0] = dataclasses.replace(result.invocations[0], output=deep)
    with pytest.raises(UntrustedResult, match="nests too deeply"):
        redact_result(result, Redactor(SECRETS))


def test_many_long_values_that_share_the_text_are_each_found() -> None:
    # The shape that froze the service: hundreds of ~1 KB values, each a near miss of the
    # text until its last characters; the automaton finds the one that is there, whole.
    secrets = {f"S{i:03d}": "a" * 1020 + f"{i:04d}" for i in range(100)}
    text = "a" * 16_000 + secrets["S042"] + "a" * 16_000
    redacted = Redactor(secrets)({"out": [text, {text: text}]})
    expected = "a" * 16_000 + "[REDACTED:S042]" + "a" * 16_000
    assert redacted == {"out": [expected, {expected: expected}]}


def test_overlapping_values_the_leftmost_is_replaced_whole() -> None:
    # "abcd-1234" then "1234-wxyz" overlap on "1234": the leftmost goes whole, the other from
    # where the first ends (what is left of it is shorter than itself).
    secrets = {"FIRST": "abcd-1234", "SECOND": "1234-wxyz"}
    assert redact("abcd-1234-wxyz", secrets) == "[REDACTED:FIRST]-wxyz"
    assert redact("1234-wxyz abcd-1234", secrets) == "[REDACTED:SECOND] [REDACTED:FIRST]"


def test_a_lone_surrogate_beside_a_secret_does_not_stop_redaction() -> None:
    # JSON can carry "\ud800"; the matcher's strings cannot, so it becomes U+FFFD first.
    assert redact("\ud800sk-live-0123456789", SECRETS) == "\ufffd[REDACTED:API_KEY]"
    # (Postgres cannot store one either: stored results show it as U+FFFD anyway.)
    assert redact("no secret \udfff here", SECRETS) == "no secret \ufffd here"
