"""The runner's dataclass code compiled at image build (gate_runner/dataclass_code.py): the
stored code is used instead of compiling, the classes are the same as compiled ones, the
loan to ``dataclasses`` ends with its block, and a file that is not this Python's is not
used."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import subprocess
import sys
import types
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

from gate_runner import dataclass_code
from gate_runner.dataclass_code import compiled_dataclasses, load, write
from tests.fixtures.dataclass_probe import parse, probe

SOURCE = """
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@dataclass
class Bag:
    items: list[int] = field(default_factory=list)
    name: str = "bag"

    def total(self) -> int:
        return sum(self.items)
"""


def define(
    name: str, code: dict[str, CodeType] | None = None, collect: dict[str, CodeType] | None = None
) -> types.ModuleType:
    """SOURCE as a fresh module ``name``, its dataclasses made under ``compiled_dataclasses``
    (or with none lent, when neither is given)."""
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses looks the module up for its annotations
    try:
        if code is None and collect is None:
            exec(compile(SOURCE, f"<{name}>", "exec"), module.__dict__)
        else:
            with compiled_dataclasses(code or {}, collect=collect):
                exec(compile(SOURCE, f"<{name}>", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def never_compile(*args: Any, **kwargs: Any) -> CodeType:
    raise AssertionError("compiled a dataclass text that was stored")


@pytest.fixture
def collected() -> dict[str, CodeType]:
    texts: dict[str, CodeType] = {}
    define("dc_collect", collect=texts)
    return texts


def test_stored_code_is_run_instead_of_compiling(
    collected: dict[str, CodeType], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Point: __init__, __repr__, __eq__, __hash__, __setattr__, __delattr__; Bag: three.
    assert len(collected) >= 9
    monkeypatch.setattr(dataclass_code, "compile", never_compile, raising=False)
    module = define("dc_stored", code=collected)
    assert module.Point(1, 2) == module.Point(1, 2)


def test_classes_from_stored_code_are_the_compiled_ones(collected: dict[str, CodeType]) -> None:
    stock, stored = define("dc_stock"), define("dc_stored", code=collected)
    for name in ("Point", "Bag"):
        a, b = getattr(stock, name), getattr(stored, name)
        assert str(inspect.signature(a)) == str(inspect.signature(b))
        assert [(f.name, f.type, f.default) for f in dataclasses.fields(a)] == [
            (f.name, f.type, f.default) for f in dataclasses.fields(b)
        ]
        for method in ("__init__", "__repr__", "__eq__"):
            code_a, code_b = getattr(a, method).__code__, getattr(b, method).__code__
            assert (code_a.co_code, code_a.co_consts, code_a.co_names) == (
                code_b.co_code,
                code_b.co_consts,
                code_b.co_names,
            )
    point = stored.Point(1, tags=("a",))
    assert repr(point) == repr(stock.Point(1, tags=("a",))).replace("dc_stock", "dc_stored")
    assert hash(point) == hash(stored.Point(1, 0, ("a",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2
    assert dataclasses.replace(point, y=5) == stored.Point(1, 5, ("a",))
    bag, other = stored.Bag(), stored.Bag()
    bag.items.append(3)
    assert (bag.total(), other.items) == (3, [])  # default_factory: a list of each its own
    with pytest.raises(TypeError):
        stored.Point()  # x is required, as compiled


def test_the_loan_ends_with_its_block(
    collected: dict[str, CodeType], monkeypatch: pytest.MonkeyPatch
) -> None:
    define("dc_stored", code=collected)
    assert not hasattr(dataclasses, "exec")
    # After the block, a dataclass compiles as usual (the stored code is not consulted).
    monkeypatch.setattr(dataclass_code, "compile", never_compile, raising=False)
    assert define("dc_after").Bag().name == "bag"
    # And one raised out of the block still ends it.
    with pytest.raises(RuntimeError), compiled_dataclasses(collected):
        raise RuntimeError("an import failed")
    assert not hasattr(dataclasses, "exec")


def test_someone_elses_exec_in_dataclasses_is_left_alone(
    collected: dict[str, CodeType], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def theirs(source: object, *rest: object) -> None:
        seen.append(source)
        exec(source, *rest)  # type: ignore[call-overload]

    monkeypatch.setattr(dataclasses, "exec", theirs, raising=False)
    define("dc_theirs", code=collected)
    assert seen and dataclasses.exec is theirs  # type: ignore[attr-defined]


def test_a_file_of_another_python_or_broken_is_not_used(
    collected: dict[str, CodeType], tmp_path: Path
) -> None:
    path = tmp_path / "code.marshal"
    write(str(path), collected)
    assert load(str(path)).keys() == collected.keys()
    data = path.read_bytes()
    magic = importlib.util.MAGIC_NUMBER
    path.write_bytes(bytes([magic[0] ^ 1]) + magic[1:] + data[len(magic) :])  # another Python
    assert load(str(path)) == {}
    path.write_bytes(data[: len(data) // 2])  # cut short
    assert load(str(path)) == {}
    path.write_bytes(magic + b"not marshal")
    assert load(str(path)) == {}
    assert load(str(tmp_path / "missing")) == {}


def test_the_build_step_stores_every_text_of_the_runners_own_imports(tmp_path: Path) -> None:
    out = tmp_path / "dataclass-code.marshal"
    # A fresh interpreter, as the image build runs it: no runner module imported yet.
    done = subprocess.run(
        [sys.executable, "-m", "gate_runner", "dataclass-code", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = subprocess.run(
        [sys.executable, "-c", probe(str(out))], capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 0, found.stderr
    stored, missed = parse(found.stdout)
    assert stored > 50 and missed == 0
