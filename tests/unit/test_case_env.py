"""The runner's handoff (environment, then nonce, on stdin) and the names a case may not use."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from gate_runner import case_env
from gate_service.config import Settings

REFUSED = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "MALLOC_CHECK_",
    "MALLOC_ARENA_MAX",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "NLSPATH",
    "NIS_PATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZDIR",
    "GETCONF_DIR",
    "GATE_RESULT_NONCE",
    "GATE_MODEL_MODE",
]


@pytest.mark.parametrize("name", REFUSED)
def test_names_the_loader_libc_python_or_the_gate_act_on_are_refused(name: str) -> None:
    why = case_env.refusal(name)
    assert why is not None and "refused" in why


@pytest.mark.parametrize(
    "name", ["OPENAI_API_KEY", "API_KEY", "LANG", "TZ", "LDAP_URL", "PYTH", "MALLOCATOR", "_X"]
)
def test_ordinary_names_pass(name: str) -> None:
    assert case_env.refusal(name) is None


def test_the_environment_and_nonce_round_trip() -> None:
    env = {"API_KEY": 'sk-ä\n"quoted"', "EMPTY": ""}
    assert case_env.decode(case_env.encode(env, "f" * 64)) == (env, "f" * 64)


def test_a_handoff_without_a_gateway_is_the_format_before_there_was_one() -> None:
    env = {"API_KEY": "sk-1"}
    data = case_env.encode(env, "n" * 64)
    assert data == b'19\n{"API_KEY": "sk-1"}' + b"n" * 64
    assert case_env.decode_handoff(data) == (case_env.Handoff(env=env), "n" * 64)
    assert case_env.decode_handoff(data)[0].gateway_token is None


def test_the_gateway_token_round_trips_beside_the_environment_not_in_it() -> None:
    env = {"API_KEY": "sk-1", "EMPTY": ""}
    data = case_env.encode(env, "n" * 64, gateway_token="tok-abc")
    handoff, nonce = case_env.decode_handoff(data)
    assert (handoff.env, handoff.gateway_token, nonce) == (env, "tok-abc", "n" * 64)
    # Readers that know only the environment still get it, without the token.
    assert case_env.decode(data) == (env, "n" * 64)
    assert "tok-abc" not in repr(handoff)


def test_reading_the_handoff_leaves_the_nonce_in_the_pipe() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, case_env.encode({"A": "1"}, "the-nonce", gateway_token="t" * 43))
    os.close(write_end)
    handoff = case_env.read_handoff(read_end)
    assert (handoff.env, handoff.gateway_token) == ({"A": "1"}, "t" * 43)
    assert case_env.read_nonce(read_end) == "the-nonce"


@pytest.mark.parametrize(
    "body",
    [
        b'{"env": {}, "gateway": {}}',
        b'{"env": {}, "gateway": {"token": ""}}',
        b'{"env": {}, "gateway": "tok"}',
        b'{"env": {"A": 1}, "gateway": {"token": "t"}}',
    ],
)
def test_a_malformed_gateway_handoff_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="handoff"):
        case_env.decode_handoff(f"{len(body)}\n".encode() + body)


def test_reading_the_environment_leaves_the_nonce_in_the_pipe() -> None:
    # The nonce must not be in the runner's memory while invocations run: the environment is
    # read up to its last byte and no further, the rest only at the end.
    read_end, write_end = os.pipe()
    os.write(write_end, case_env.encode({"A": "1" * 5000}, "the-nonce"))
    os.close(write_end)
    try:
        assert case_env.read_environment(read_end) == {"A": "1" * 5000}
        assert os.read(read_end, 100) == b"the-nonce"
    finally:
        os.close(read_end)


def test_the_nonce_is_read_to_the_end_and_its_descriptor_closed() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, case_env.encode({}, "n" * 64))
    os.close(write_end)
    case_env.read_environment(read_end)
    assert case_env.read_nonce(read_end) == "n" * 64
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(read_end)


@pytest.mark.parametrize(
    "data",
    [b"", b"12", b"abc\n{}", b"99999999999999999\n", b"10\n{}", b"2\n[]", b'9\n{"A": 1}'],
)
def test_a_malformed_handoff_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"handoff|JSON|Expecting"):
        case_env.decode(data)


def test_gate_case_env_with_a_refused_name_fails_at_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATE_CASE_ENV", "OPENAI_API_KEY, LD_PRELOAD")
    with pytest.raises(ValidationError, match="GATE_CASE_ENV names 'LD_PRELOAD'"):
        Settings()
    monkeypatch.setenv("GATE_CASE_ENV", "OPENAI_API_KEY, ANTHROPIC_API_KEY")
    assert Settings().case_env_names() == ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]


def test_case_env_names_leave_a_refused_name_out_where_validation_was_skipped() -> None:
    unchecked = Settings().model_copy(update={"case_env": "A_KEY,PYTHONPATH,GATE_X"})
    assert unchecked.case_env_names() == ["A_KEY"]
