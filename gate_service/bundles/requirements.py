"""A bundle's requirements.txt, read as data: PEP 508 requirements, never pip input.

pip's requirements-file syntax is a small language of its own (options, ``-r`` includes,
URLs, paths, ``${VAR}`` expansion, line continuations), and pip is lenient about the bytes it
reads (it strips a byte order mark, so ``\\ufeff--no-binary=:all:`` is an option to pip). So
the file is never given to pip: each line is parsed here with ``packaging`` as one PEP 508
requirement (a name with extras, version specifiers and markers), and only the canonical
strings of what parsed are later passed to pip as separate arguments. Every bad line is
reported, not only the first, in the shape of the suites' problems.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

FILE = "requirements.txt"

# pip's own comment rule: '#' at the start of a line or after whitespace ends the line.
_COMMENT = re.compile(r"(?:^|\s)#.*$")
ARCHIVE_SUFFIXES = (
    ".whl", ".zip", ".tar", ".tgz", ".tar.gz", ".tbz", ".tbz2", ".tar.bz2", ".txz",
    ".tar.xz", ".tlz", ".tar.lz", ".tar.lzma", ".egg",
)  # fmt: skip
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # a scheme such as https:, git+ssh:, file:


@dataclass
class RequirementsReport:
    requirements: list[str] = field(default_factory=list)  # canonical str(Requirement)
    problems: list[dict[str, Any]] = field(default_factory=list)


def read_requirements(path: Path) -> RequirementsReport:
    """The requirements of ``path`` (a bundle's requirements.txt); no file means none."""
    if not path.is_file():
        return RequirementsReport()
    return parse_requirements(path.read_bytes())


def parse_requirements(data: bytes) -> RequirementsReport:
    report = RequirementsReport()
    for number, raw in enumerate(data.split(b"\n"), 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        result = _parse_line(raw)
        if isinstance(result, Requirement):
            report.requirements.append(str(result))
        elif result is not None:
            report.problems.append({"file": FILE, "line": number, "message": result})
    return report


def _parse_line(raw: bytes) -> Requirement | str | None:
    """The line's requirement, None for a blank or comment line, or why it is refused."""
    bad = next((i for i, byte in enumerate(raw) if byte > 0x7F), None)
    if bad is not None:
        return _non_ascii(raw, bad)
    text = raw.decode("ascii")
    control = next((c for c in text if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F), None)
    if control is not None:
        return f"control character {ord(control):#04x} is not allowed"
    line = _COMMENT.sub("", text).strip()
    if not line:
        return None
    if "\\" in line:
        return "a backslash (line continuation) is not allowed; write one requirement per line"
    if line.startswith("-"):
        option = line.split()[0].split("=", 1)[0]
        return f"pip options such as {option} are not allowed; only requirements are"
    if "$" in line:
        return "environment variables ($) are not allowed"
    try:
        requirement = Requirement(line)
    except InvalidRequirement as exc:
        if "://" in line or _URL.match(line):
            return "URLs are not allowed; name a package and its versions instead"
        if line.startswith((".", "/", "~")) or "/" in line:
            return "paths are not allowed; name a package and its versions instead"
        return f"not a PEP 508 requirement: {str(exc).splitlines()[0]}"
    if requirement.url is not None:
        return "URL requirements (name @ url) are not allowed; give a version instead"
    if requirement.name.lower().endswith(ARCHIVE_SUFFIXES):
        # A valid PEP 508 name, but pip reads `x-1.0-py3-none-any.whl` or `x.tar.gz` as a
        # file to install (and would build an sdist it found), so it is refused as a path.
        return "a name ending like an archive (.whl, .zip, .tar.gz, ...) is read by pip as a file"
    return requirement


def _non_ascii(raw: bytes, index: int) -> str:
    """Name the first non-ASCII character (or byte, when it is not UTF-8) of a line."""
    column = len(raw[:index].decode("ascii")) + 1
    try:
        char = raw[index:].decode("utf-8")[0]
    except UnicodeDecodeError as exc:
        if exc.start > 0:  # the character itself is valid; something after it is not
            char = raw[index : index + exc.start].decode("utf-8")[0]
        else:
            return (
                f"non-ASCII byte {raw[index]:#04x} at column {column}; "
                "requirements.txt must be plain ASCII"
            )
    name = unicodedata.name(char, "unnamed")
    if char == "\ufeff":
        name += ", a byte order mark"
    return (
        f"non-ASCII character U+{ord(char):04X} ({name}) at column {column}; "
        "requirements.txt must be plain ASCII"
    )
