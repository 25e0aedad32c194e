"""The runner's dataclass methods, compiled once when the runner image is built.

CPython makes each dataclass's ``__init__``, ``__repr__``, ``__eq__`` and the rest by writing
their source and compiling it (``exec`` in ``dataclasses``) every time the class is defined.
The runner defines about 23 dataclasses on its way to a case, and that compiling was half of
the CPU its own imports cost in every case container (8 of 16 ms, Python 3.11).

So ``gate_runner dataclass-code`` (a step of the runner image's build) imports the runner's
modules (the run-case path's: ``case.runner_imports``, and those a case imports later as it
needs them: ``case.later_runner_imports``) and keeps, for every source text
``dataclasses`` compiles, the compiled code, marshalled and keyed by the text itself. At
run time ``compiled_dataclasses`` lends that code to ``dataclasses`` while the runner imports
its own modules: a text found there runs its stored code, which is what compiling the same
text gives; any other text is compiled as usual. The file is read once a process, however
many times the code is lent. The classes are the same either way. The
file is the image's, root-owned on a read-only root, like the image's .pyc files; a file of
another Python (its marshal format and bytecode differ), or none at all, is simply not used.
Neither the SDK's imports nor user code ever run under it: it is lent for the runner's own
imports and taken back after them.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import importlib.util
import marshal
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any

CODE_PATH = "/opt/gate-runner/dataclass-code.marshal"
# What the file starts with: this Python's bytecode magic (as a .pyc does). A file of another
# Python is not read past it.
MAGIC = importlib.util.MAGIC_NUMBER


def load(path: str = CODE_PATH) -> dict[str, CodeType]:
    """The stored code by source text; empty when the file is missing, of another Python or
    not what ``write`` makes."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return {}
    if not data.startswith(MAGIC):
        return {}
    try:
        found = marshal.loads(data[len(MAGIC) :])
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {
        text: code
        for text, code in found.items()
        if isinstance(text, str) and isinstance(code, CodeType)
    }


def write(path: str, code: dict[str, CodeType]) -> None:
    with open(path, "wb") as file:
        file.write(MAGIC + marshal.dumps(code))


@functools.cache
def _image_code() -> dict[str, CodeType]:
    """``load()`` of the image's file, read once: the runner lends it again for the modules
    a case imports later (the gateway client, the light path)."""
    return load()


@contextmanager
def compiled_dataclasses(
    code: dict[str, CodeType] | None = None, *, collect: dict[str, CodeType] | None = None
) -> Iterator[None]:
    """Within the block, a dataclass defined anywhere runs the stored code of the source
    texts ``code`` holds (default: the image's file) instead of compiling them; every text compiled
    meanwhile is added to ``collect`` when given (the image build's collection).

    ``dataclasses`` calls the builtin ``exec`` by name; a module global of that name takes
    its place for the block and is removed after it.
    """
    stored = _image_code() if code is None else code
    if not stored and collect is None:
        yield
        return

    def exec_stored(source: Any, scope: Any = None, names: Any = None, /) -> None:
        if isinstance(source, str):
            compiled = stored.get(source)
            if compiled is None:
                # What the builtin compiles a string as (the same name and flags).
                compiled = compile(source, "<string>", "exec", dont_inherit=True)
                if collect is not None:
                    collect[source] = compiled
            source = compiled
        builtins.exec(source, scope, names)

    if hasattr(dataclasses, "exec"):  # someone else's: leave dataclasses as it is
        yield
        return
    dataclasses.exec = exec_stored  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del dataclasses.exec  # type: ignore[attr-defined]
