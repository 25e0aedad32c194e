"""A result's shapes as the service and its client answer and read them, built from the
runner's contract (``gate_runner.contract``) rather than written again.

The contract's dataclasses are the one declaration of what a span, a run (an ``Invocation``)
and a case's result hold. The REST schemas (``gates.schemas``), the Connic schemas
(``connic_api.schemas``) and the client's typed models (``client.shapes``) take their fields
from here, in the contract's order, with their own additions (ids), omissions and renames
said beside them; ``stored_runs`` sorts the same fields into how a run stores them. A field
added to the contract is then answered, stored and read back without another list to edit.

A leaf: imports pydantic and the contract only, so the client (which otherwise imports
nothing of the service) may build on it too.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel, create_model

# pydantic's field definition: (annotation, default or FieldInfo); `...` is required.
FieldDef = tuple[Any, Any]


def contract_types(shape: type) -> dict[str, Any]:
    """Each field of a contract dataclass with its resolved type, in declaration order."""
    hints = typing.get_type_hints(shape)
    return {f.name: hints[f.name] for f in dataclasses.fields(shape)}


def contract_fields(
    shape: type,
    *,
    drop: Collection[str] = (),
    replace: Mapping[str, Mapping[str, FieldDef]] | None = None,
    optional: bool = False,
) -> dict[str, FieldDef]:
    """The fields of a contract dataclass as pydantic field definitions, in its order.

    ``drop``: fields left out; ``replace``: a field answered as other fields in its place
    (its name and type changed, say); ``optional``: every field defaults to None, for a
    reader that must take what an older or newer service answers.
    """
    replace = replace or {}
    types = contract_types(shape)
    out: dict[str, FieldDef] = {}
    for f in dataclasses.fields(shape):
        if f.name in drop:
            continue
        if f.name in replace:
            out.update(replace[f.name])
            continue
        kind = types[f.name]
        if optional:
            out[f.name] = (kind | None, None)
        else:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            out[f.name] = (kind, ... if required else f.default)
    return out


def shape_model(name: str, base: type[BaseModel], fields: Mapping[str, FieldDef]) -> Any:
    """A pydantic model of ``fields`` on ``base``, typed Any so a class may derive from it
    (``class RunRead(shape_model(...))``) and be named in annotations."""
    definitions: dict[str, Any] = dict(fields)
    return create_model(name, __base__=base, **definitions)


def carried(source: Any, model: type[BaseModel]) -> dict[str, Any]:
    """The values ``source`` holds under the names of ``model``'s fields (an attribute
    each): what a mapping from one shape onto the next copies unchanged."""
    return {name: getattr(source, name) for name in model.model_fields if hasattr(source, name)}
