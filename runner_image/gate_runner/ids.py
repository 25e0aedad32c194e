"""Random ids in the text form of ``str(uuid.uuid4())``, without importing ``uuid``.

``uuid`` imports ``platform``, which compiles a dozen regular expressions as it is imported:
about 5 ms of CPU in every case container, for the one run id a case makes. The text is the
standard's version 4 form, the same ``uuid.uuid4()`` gives (tests/unit/test_ids.py).
"""

from __future__ import annotations

import os


def uuid4_text() -> str:
    """A random id: 122 random bits, version 4, the RFC 4122 variant, in 8-4-4-4-12 hex."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # variant RFC 4122
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
