"""Token material: random, high-entropy, shown once, stored only as a SHA-256."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from enum import StrEnum

TOKEN_PREFIX = "gate_"


class Scope(StrEnum):
    submit = "submit"  # submit and cancel gates
    read = "read"  # read gates, cases and runs
    admin = "admin"  # tokens, secrets and audit of the project (and all of it, in `default`)


def new_token() -> str:
    """256 bits from the OS's CSPRNG; the prefix makes a leaked token easy to scan for."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """SHA-256 is enough for a random 256-bit token: there is nothing to brute-force."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def digests_match(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
