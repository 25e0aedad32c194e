"""Where a person reads a gate: its results page, as html_url and the connic CLI's link, and
a case's page (the Markdown summary links each case it lists)."""

from __future__ import annotations

import uuid

UI_PREFIX = "/ui"


def gate_page_path(gate_id: uuid.UUID | str) -> str:
    return f"{UI_PREFIX}/gates/{gate_id}"


def gate_html_url(public_url: str, gate_id: uuid.UUID | str) -> str:
    """Absolute under GATE_PUBLIC_URL (already normalised: no trailing slash); a path when it
    is unset, since the service cannot know which of its names a browser uses."""
    return f"{public_url}{gate_page_path(gate_id)}"


def case_page_path(case_id: uuid.UUID | str) -> str:
    return f"{UI_PREFIX}/cases/{case_id}"


def case_html_url(public_url: str, case_id: uuid.UUID | str) -> str:
    """A case's page, as ``gate_html_url`` is the gate's."""
    return f"{public_url}{case_page_path(case_id)}"
