"""The listeners' reconnect back-off (gate_service/listen.py, used by gates/notify.py and worker/wakeup.py)."""

from gate_service.listen import (
    RECONNECT_MAX_SECONDS,
    RECONNECT_MIN_SECONDS,
    STABLE_SECONDS,
    reconnect_delay,
)


def test_connections_that_break_at_once_back_off_to_the_maximum() -> None:
    delay, delays = RECONNECT_MIN_SECONDS / 2, []
    for _ in range(8):
        delay = reconnect_delay(delay, lasted_seconds=0.1)  # connected, then broke at once
        delays.append(delay)
    assert delays[:3] == [
        RECONNECT_MIN_SECONDS,
        2 * RECONNECT_MIN_SECONDS,
        4 * RECONNECT_MIN_SECONDS,
    ]
    assert delays == sorted(delays) and delays[-1] == RECONNECT_MAX_SECONDS


def test_a_connection_that_lasted_starts_the_back_off_over() -> None:
    assert reconnect_delay(RECONNECT_MAX_SECONDS, STABLE_SECONDS) == RECONNECT_MIN_SECONDS
