"""The two generated tables of docs/: every setting (from ``Settings``) and the support table
(from ``bundles/support.py``), each written between its markers.

``python -m gate_service.docs_tables`` writes them; ``--check`` exits 1 naming each page that
differs (tests/unit/test_docs.py runs the check, so a setting or a support row changed
without its page fails the tests).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from .bundles import support
from .config import Settings

DOCS = Path(__file__).resolve().parent.parent / "docs"
SETTINGS_PAGE = "settings.md"
SUPPORT_PAGE = "support.md"


def _shown_default(field: Any) -> str:
    """A field's default as a person reads it: its ``shown_default`` when the value is worked
    out at start-up (the CPU count, a path under $TMPDIR), else the value itself."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "shown_default" in extra:
        return str(extra["shown_default"])
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, bool):
        value = str(value).lower()
    value = getattr(value, "value", value)  # an enum's member reads as its value
    return f"`{value}`"


def settings_table() -> str:
    """Every setting as a row: its variable, default and meaning (the field's description)."""
    lines = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        meaning = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `GATE_{name.upper()}` | {_shown_default(field)} | {meaning} |")
    return "\n".join(lines) + "\n"


# page -> (marker name, what it says generates it, the table)
TABLES = {
    SETTINGS_PAGE: ("settings-table", "gate_service/config.py (Settings)", settings_table),
    SUPPORT_PAGE: ("support-table", "gate_service/bundles/support.py", support.markdown_table),
}


def rendered(page: str, text: str) -> str:
    """``text`` (the page) with its table regenerated between its markers."""
    marker, source, table = TABLES[page]
    pattern = re.compile(rf"(<!-- {marker}:[^\n]*-->\n)(.*?)(<!-- /{marker} -->)", re.S)
    if pattern.search(text) is None:
        raise ValueError(f"docs/{page} has no <!-- {marker}: ... --> and <!-- /{marker} -->")
    head = f"<!-- {marker}: generated from {source} by python -m gate_service.docs_tables -->\n"
    return pattern.sub(lambda m: head + table() + m.group(3), text, count=1)


def stale(docs: Path = DOCS) -> list[str]:
    """The pages whose table differs from what the code says."""
    return [
        page
        for page in TABLES
        if (text := (docs / page).read_text(encoding="utf-8")) != rendered(page, text)
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        differing = stale()
        for page in differing:
            sys.stdout.write(
                f"docs/{page} differs from the code: run python -m gate_service.docs_tables\n"
            )
        return 1 if differing else 0
    if args:
        sys.stderr.write("usage: python -m gate_service.docs_tables [--check]\n")
        return 2
    for page in TABLES:
        path = DOCS / page
        path.write_text(rendered(page, path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
