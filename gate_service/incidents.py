"""Infrastructure failures told to users without the host's details.

What a user reads (a gate's failure_reason, a job's last error) gets a short summary and a
reference id; the full message, with paths, SQL, addresses and the Docker socket, goes to the
log under that same id, where an operator can find it.
"""

from __future__ import annotations

import re
import secrets

# Cut where SQLAlchemy starts quoting the statement or its parameters.
_SQL_MARKERS = ("[SQL:", "[parameters:", "(Background on this error")
_REPLACEMENTS = (
    # scheme://... : http+docker://localhost/..., unix:///var/run/docker.sock, postgresql://...
    (re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://\S*"), "<url>"),
    # An absolute path at the start of a word: /var/lib/gate/..., /tmp/gate-x/bundle.
    (re.compile(r"(?<![\w.~/-])~?/[^\s'\"()\[\],;]*"), "<path>"),
    # user:password@host:port and host=..., as database and socket errors print them. From
    # the start of a run of name characters only (not from each word boundary in it, which
    # rescanned "a.a.a..." from every letter): a match from inside a run is one from its start.
    (re.compile(r"(?<![\w.-])[\w.-]+(?::[^\s@/]*)?@[\w.-]+(?::\d+)?"), "<address>"),
    (re.compile(r"\b(host(?:name)?|port|user|dbname|database)\s*[=:]\s*\"?[\w.:-]+\"?", re.I),
     r"\1=<hidden>"),
    # IPv4 and bracketed or bare IPv6 addresses, with an optional port.
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<address>"),
    # The ':' and '::' each address must hold are looked for ahead, once: two runs of the
    # same class around them rescanned the rest of the run from every ':' (quadratic).
    (re.compile(r"\[(?=[0-9a-fA-F:.]*:)[0-9a-fA-F:.]*\](?::\d+)?"), "<address>"),
    (re.compile(r"(?<![\w:])(?:[0-9a-fA-F]{1,4}:){3,7}[0-9a-fA-F]{1,4}(?![\w:])"), "<address>"),
    (re.compile(r"(?<![\w:])(?=[0-9a-fA-F:]*::)[0-9a-fA-F:]*[0-9a-fA-F](?![\w:])"), "<address>"),
)  # fmt: skip
# Only the first line's first characters are scrubbed (the summary keeps SUMMARY_LIMIT of
# them; the whole message goes to the log): the patterns above then cost a bounded time
# whatever the message holds, a bundle's text in an engine's error included.
MAX_SCRUBBED_CHARS = 512
_DATABASE_WORDS = ("psycopg", "sqlalchemy", "postgres")
SUMMARY_LIMIT = 240


def new_reference() -> str:
    """An id to quote: short enough to read out, random enough to find one log line."""
    return secrets.token_hex(6)


def scrub(text: str, *, limit: int = SUMMARY_LIMIT) -> str:
    """The first line of ``text`` without SQL, paths, URLs or addresses, at most ``limit`` chars."""
    for marker in _SQL_MARKERS:
        text = text.split(marker, 1)[0]
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    if len(line) > MAX_SCRUBBED_CHARS:
        # Without its last, cut word: a cut address or path might not be recognised.
        words = line[:MAX_SCRUBBED_CHARS].rsplit(None, 1)
        line = words[0] if len(words) == 2 else ""
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    for pattern, replacement in _REPLACEMENTS:
        line = pattern.sub(replacement, line)
    line = " ".join(line.split()).rstrip(" :;,(")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def summary(exc: BaseException | str) -> str:
    """A short human summary of an infrastructure failure, safe to store and show."""
    if isinstance(exc, str):
        if any(word in exc.lower() for word in _DATABASE_WORDS):
            return "the database failed"
        return scrub(exc) or "an infrastructure error"
    module = type(exc).__module__.split(".", 1)[0]
    if module in _DATABASE_WORDS:
        return f"the database failed ({type(exc).__name__})"
    if isinstance(exc, OSError):  # its strerror names the trouble; its filename is the host's
        why = f": {exc.strerror}" if exc.strerror else ""
        return f"an operating-system call failed ({type(exc).__name__}{why})"
    text = getattr(exc, "detail", None)
    said = scrub(text if isinstance(text, str) else str(exc))
    if any(word in said.lower() for word in _DATABASE_WORDS):
        return f"the database failed ({type(exc).__name__})"
    return said or f"an internal error ({type(exc).__name__})"


def public(exc: BaseException | str, reference: str) -> str:
    """``summary`` with the reference id the log has the full detail under."""
    return f"{summary(exc)} (reference {reference}; the full detail is in the worker log)"
