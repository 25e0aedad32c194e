"""What is stored for a run: values Postgres can hold, each large value once, under a byte cap.

A run's result is the bundle's output, so it is input here. After redaction (which must come
first: a cut made before it could leave part of a secret behind), ``pack_run`` makes it:

1. **storable**: Postgres JSONB holds no NaN or infinity, and neither text nor JSONB holds
   NUL or a lone surrogate (half of a UTF-16 pair, which Python strings may carry). NaN,
   Infinity and -Infinity become the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``;
   NUL and every lone surrogate become U+FFFD, in keys too.
2. **shared**: a string, list or object of at least ``SHARE_MIN_BYTES`` that occurs more than
   once in the run (a tool agent's result is the tool-call span's result, the run's output and
   the outbound span's output) is stored once, in the run's ``shared_values`` under the first
   32 hex digits of its hash, and each place holds ``{"$gate.value": id}``. A bundle's own
   object that looks like such a reference is stored wrapped (``{"$gate.escaped": object}``),
   so nothing a bundle writes is read back as one. ``unpack`` resolves both for every
   answer, so the API returns the run's full shape.
3. **capped**: the run's stored bytes are those of the JSON text of all it stores (every key,
   span and shared value). Past the cap the longest strings are cut first, all to one common
   length (so a huge input does not leave the output nothing); a string cut keeps its head
   and ends in ``…[N bytes cut]``. When the structure alone is too large (a million short
   items), containers keep their first items and end in that mark (a list as an item, an
   object under the key ``…``, the spans as a last span of type ``cut``). The run's
   ``failure_reason`` then says how many bytes were cut and which limit cut them.

The fields are the runner's ``Invocation``'s, sorted by their type (``gate_service.results``):
a scalar (int, bool, str) is a column of its own (``SCALAR_FIELDS``), optional text is cut
with the document (``TEXT_FIELDS``), anything else is storable JSON (``JSON_FIELDS``); a list
holds at least ``[]`` and an object ``{}``. A field added to the contract is stored, cut and
read back (``stored_fields``, ``read_back``) with no change here.

Plain values in, plain values out: of the project it imports only the runner's contract
(``gate_runner.contract``: the fields, the span shape a cut span takes, and the cut mark) and
the leaf that reads its fields.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_origin

from gate_runner.contract import Invocation, Span, cut_mark

from .results import contract_types

REF = "$gate.value"
ESCAPED = "$gate.escaped"
SHARED = "shared_values"
# Smaller values are kept where they are: a reference (about 50 bytes) would save little.
SHARE_MIN_BYTES = 256
ID_HEX_DIGITS = 32
# Any cap must hold a run's skeleton (every field at its smallest) and the note on the cut.
MIN_STORED_RUN_BYTES = 4096
# Room kept for the note that failure_reason gains when something was cut.
NOTE_BYTES = 400
# When the structure is cut as well, strings first keep at most this much of their head.
STRUCTURE_STRING_BYTES = 64
# The stored run's fields: the contract's Invocation's, by their type (see the docstring).
FIELD_TYPES: dict[str, Any] = contract_types(Invocation)
SCALAR_FIELDS = tuple(n for n, kind in FIELD_TYPES.items() if kind in (int, bool, str))
# A cut keeps these first, in this order, then the contract's other fields in its order.
CUT_ORDER = ("failure_reason", "error", "failed_assertions", "output", "input", "run_context")
_CUT = sorted(
    (n for n in FIELD_TYPES if n not in SCALAR_FIELDS),
    key=lambda n: CUT_ORDER.index(n) if n in CUT_ORDER else len(CUT_ORDER),
)
TEXT_FIELDS = tuple(n for n in _CUT if FIELD_TYPES[n] == str | None)
JSON_FIELDS = tuple(n for n in _CUT if n not in TEXT_FIELDS)
# Lists of spans (the trace): cut span by span, the rest standing as one span of type `cut`.
SPAN_FIELDS = frozenset(n for n in JSON_FIELDS if FIELD_TYPES[n] == list[Span])
MARK_KEY = "…"
# Deeper containers are cut: every walk here recurses, and outputs nest far less than this.
MAX_STORED_DEPTH = 100
# A cut string or container ends with a mark; ` #2` only tells apart two keys cut alike.
MARK = re.compile(r"…\[(\d+) bytes cut\](?: #\d+)?\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
T = TypeVar("T")
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_encode_str = json.encoder.encode_basestring  # the C one where it is there
_SCALARS = frozenset({int, float, bool, type(None)})
FLAT_MIN_ITEMS = 32


# The runner's mark: a run counts its cut bytes the same whoever cut it.
mark = cut_mark


# -- 1. storable ---------------------------------------------------------------------------


def storable_text(text: str) -> str:
    """``text`` without NUL and lone surrogates (each becomes U+FFFD)."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def storable(value: Any) -> Any:
    """``value`` in a form Postgres can store: see the module's docstring, step 1.

    Two keys of one object that differ only in what is replaced become one (the last wins).
    What nests deeper than MAX_STORED_DEPTH is cut (every walk after this one recurses).
    """
    return _storable(value, 0, escape=False)


def _storable(value: Any, depth: int, *, escape: bool) -> Any:
    """``storable``; with ``escape`` every object that would read as a reference is wrapped."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE.get(value, "NaN")
    if isinstance(value, list | tuple | dict) and depth >= MAX_STORED_DEPTH:
        return mark(len(_ENCODER.encode(value).encode("utf-8", "replace")))
    if isinstance(value, list | tuple):
        if _flat(value) and all(math.isfinite(v) for v in value if type(v) is float):
            return list(value)
        return [_storable(v, depth + 1, escape=escape) for v in value]
    if isinstance(value, dict):
        out = {
            storable_text(str(k)): _storable(v, depth + 1, escape=escape) for k, v in value.items()
        }
        if escape and len(out) == 1 and (REF in out or ESCAPED in out):
            return {ESCAPED: out}
        return out
    return value


def unpack(value: Any, shared: dict[str, Any]) -> Any:
    """A stored value as the run produced it (storable, cut where it was cut)."""
    if isinstance(value, list):
        return value if _flat(value) else [unpack(v, shared) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            if isinstance(value.get(REF), str) and value[REF] in shared:
                return unpack(shared[value[REF]], shared)
            if isinstance(value.get(ESCAPED), dict):
                return {k: unpack(v, shared) for k, v in value[ESCAPED].items()}
        return {k: unpack(v, shared) for k, v in value.items()}
    return value


# -- sizes ---------------------------------------------------------------------------------


def _json(value: Any) -> bytes:
    """``value`` as compact JSON text (UTF-8); leaves without the encoder's per-call cost."""
    if isinstance(value, str):
        return _encode_str(value).encode()
    if value is None or value is True or value is False:
        return b"null" if value is None else b"true" if value else b"false"
    if isinstance(value, int):
        return str(int(value)).encode()
    if isinstance(value, float):
        return float.__repr__(value).encode()
    return _ENCODER.encode(value).encode()


def _flat(node: list[Any] | tuple[Any, ...]) -> bool:
    """A long list of numbers, booleans and nulls only: measured whole, never walked inside
    (a short one is cheaper to walk than to encode)."""
    return len(node) >= FLAT_MIN_ITEMS and set(map(type, node)) <= _SCALARS


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as compact JSON text: what a stored run's size counts."""
    return len(_json(value))


class _Sizes:
    """Sizes of the nodes of one tree, each container measured once."""

    def __init__(self) -> None:
        self._of: dict[int, int] = {}

    def __call__(self, node: Any) -> int:
        if not isinstance(node, list | dict):
            return len(_json(node))
        known = self._of.get(id(node))
        if known is None:
            if isinstance(node, list):
                if _flat(node):
                    known = len(_json(node))
                else:
                    known = 2 + sum(self(v) for v in node) + max(0, len(node) - 1)
            else:
                known = (
                    2
                    + sum(len(_json(k)) + 1 + self(v) for k, v in node.items())
                    + max(0, len(node) - 1)
                )
            self._of[id(node)] = known
        return known


# -- 2. shared -----------------------------------------------------------------------------


class _Sharer:
    """Finds the values of SHARE_MIN_BYTES or more that occur more than once in a tree.

    Each node gets a token: its canonical JSON when small, else ``#`` and a hash over its
    children's tokens (a Merkle hash), so the whole tree is hashed in one linear pass.
    """

    def __init__(self) -> None:
        self._large: dict[int, bytes] = {}  # id(node) -> token, for nodes that could be shared
        self._seen: Counter[bytes] = Counter()
        self._nodes: list[Any] = []  # keeps every measured node alive, so ids stay unique

    def measure(self, node: Any, *, shareable: bool = True) -> tuple[int, bytes]:
        if isinstance(node, list) and _flat(node):
            body = _json(node)
            size = len(body)
        elif isinstance(node, list):
            parts = [self.measure(v) for v in node]
            size = 2 + sum(p[0] for p in parts) + max(0, len(parts) - 1)
            body = b"[" + b",".join(p[1] for p in parts) + b"]"
        elif isinstance(node, dict):
            wrapper = len(node) == 1 and ESCAPED in node  # its object must stay an object
            items = []
            for key, child in node.items():
                encoded = _json(key)
                child_size, token = self.measure(child, shareable=not wrapper)
                items.append((encoded, child_size, token))
            size = 2 + sum(len(k) + 1 + s for k, s, _ in items) + max(0, len(items) - 1)
            body = b"{" + b",".join(k + b":" + t for k, _, t in sorted(items)) + b"}"
        else:
            body = _json(node)
            size = len(body)
        if size < SHARE_MIN_BYTES:
            return size, body
        token = b"#" + hashlib.sha256(body).hexdigest()[:ID_HEX_DIGITS].encode()
        if shareable and isinstance(node, str | list | dict):
            self._large[id(node)] = token
            self._nodes.append(node)
        return size, token

    def count(self, node: Any) -> None:
        """Count the places of each large value; inside a value only at its first place, so
        a repeated value's parts are not also shared one by one."""
        token = self._large.get(id(node))
        if token is not None:
            self._seen[token] += 1
            if self._seen[token] > 1:
                return
        if isinstance(node, list) and not _flat(node):
            for child in node:
                self.count(child)
        elif isinstance(node, dict):
            for child in node.values():
                self.count(child)

    def share(self, node: Any, shared: dict[str, Any], *, root: bool = False) -> Any:
        token = self._large.get(id(node))
        if token is not None and not root and self._seen[token] > 1:
            value_id = token[1:].decode()
            if value_id not in shared:
                shared[value_id] = None  # its place: values keep the order of first use
                shared[value_id] = self.share(node, shared, root=True)
            return {REF: value_id}
        if isinstance(node, list):
            return node if _flat(node) else [self.share(v, shared) for v in node]
        if isinstance(node, dict):
            if len(node) == 1 and isinstance(node.get(ESCAPED), dict):
                return {ESCAPED: {k: self.share(v, shared) for k, v in node[ESCAPED].items()}}
            return {k: self.share(v, shared) for k, v in node.items()}
        return node


def _shared(fields: dict[str, Any]) -> dict[str, Any]:
    """The run's document: its fields with repeated large values referenced, and SHARED."""
    sharer = _Sharer()
    for name in JSON_FIELDS:
        sharer.measure(fields[name])
    for name in JSON_FIELDS:
        sharer.count(fields[name])
    shared: dict[str, Any] = {}
    doc = {name: sharer.share(fields[name], shared) for name in JSON_FIELDS}
    doc.update({name: fields[name] for name in TEXT_FIELDS})
    doc[SHARED] = shared
    return doc


# -- 3. capped -----------------------------------------------------------------------------


def _is_ref(node: Any) -> bool:
    return isinstance(node, dict) and len(node) == 1 and isinstance(node.get(REF), str)


def _strings(doc: dict[str, Any]) -> Iterator[str]:
    """Every string a cut may shorten: keys and values, not references or shared ids."""
    stack: list[Any] = [doc[name] for name in (*JSON_FIELDS, *TEXT_FIELDS)]
    stack += list(doc[SHARED].values())
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            if not _flat(node):
                stack += node
        elif isinstance(node, dict) and not _is_ref(node):
            for key, child in node.items():
                yield key
                stack.append(child)


def cut_text(text: str, keep_bytes: int, suffix: str = "") -> str:
    """The head of ``text`` whose JSON text is at most ``keep_bytes``, then its mark."""
    keep = text[: max(0, keep_bytes)]
    over = json_bytes(keep) - 2 - keep_bytes
    if over > 0:  # escapes and multi-byte characters: each character dropped is >= 1 byte
        keep = keep[: max(0, len(keep) - over)]
    cut = len(text.encode()) - len(keep.encode())
    return keep + mark(cut) + suffix


class _StringCut:
    """Every string whose JSON text is longer than ``limit`` + a mark, cut to ``limit``."""

    def __init__(self, limit: int, mark_bytes: int) -> None:
        self.limit, self.mark_bytes = limit, mark_bytes

    def text(self, text: str) -> str:
        if json_bytes(text) - 2 <= self.limit + self.mark_bytes:
            return text
        return cut_text(text, self.limit)

    def __call__(self, node: Any) -> Any:
        if isinstance(node, str):
            return self.text(node)
        if isinstance(node, list):
            return node if _flat(node) else [self(v) for v in node]
        if isinstance(node, dict) and not _is_ref(node):
            out: dict[str, Any] = {}
            for key, child in node.items():
                new = self.text(key)
                # Two long keys with one head and length would collide once cut.
                for n in itertools.count(2):
                    if new not in out:
                        break
                    new = cut_text(key, self.limit, f" #{n}")
                out[new] = self(child)
            return out
        return node

    def doc(self, doc: dict[str, Any]) -> dict[str, Any]:
        out = {name: self(doc[name]) for name in (*JSON_FIELDS, *TEXT_FIELDS)}
        out[SHARED] = {k: self(v) for k, v in doc[SHARED].items()}
        return out


def _mark_bytes(total: int) -> int:
    return len(mark(total).encode())


def _water_level(doc: dict[str, Any], budget: int, total: int) -> int | None:
    """The longest common string length at which the document fits, or None if none does.

    Computed from each string's size alone (sorted, with prefix sums), never by cutting and
    measuring again: with a mark as long as the longest possible, the estimate is an upper
    bound of the size that cutting then gives.
    """
    sizes = sorted(json_bytes(s) - 2 for s in _strings(doc))
    fixed = total - sum(sizes)
    prefix = [0, *itertools.accumulate(sizes)]
    m = _mark_bytes(total)

    def estimate(limit: int) -> int:
        kept = bisect.bisect_right(sizes, limit + m)
        return fixed + prefix[kept] + (len(sizes) - kept) * (limit + m)

    if not sizes or estimate(0) > budget:
        return None
    low, high = 0, sizes[-1]
    while low < high:
        mid = (low + high + 1) // 2
        if estimate(mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


CUT_SPAN_TYPE = "cut"


def _cut_span(cut_bytes: int, spans: int) -> dict[str, Any]:
    """The span that stands for the spans cut away: a Span, so the API answers it as one."""
    return Span(
        span_id="cut",
        parent_span_id=None,
        span_order=0,
        type=CUT_SPAN_TYPE,
        name=mark(cut_bytes),
        status="cut",
        duration_ms=0,
        metadata={"spans_cut": spans},
    ).as_dict()


class _Fitter:
    """Cuts a tree of plain values (no references) to a byte budget, first come, first kept."""

    def __init__(self, total: int) -> None:
        self.size = _Sizes()
        self.slot = _mark_bytes(total) + 3  # a mark as a list item or object value: quotes, comma

    def rest(self, nodes: list[Any]) -> int:
        return sum(self.size(n) for n in nodes) + len(nodes)

    def text(self, text: str, room: int) -> str:
        if json_bytes(text) <= room:
            return text
        return cut_text(text, room - self.slot)

    def fit(self, node: Any, room: int) -> Any:
        if self.size(node) <= room:
            return node
        if _is_ref(node):  # never cut inside: a cut id would point nowhere
            return mark(self.size(node))
        if isinstance(node, str):
            return self.text(node, room)
        if isinstance(node, list) and _flat(node):
            return self._flat_items(node, room)
        if isinstance(node, list):
            return self._items(list(node), room, lambda kept, rest: [*kept, mark(rest)])
        if isinstance(node, dict):
            return self.mapping(node, room)
        return mark(self.size(node))  # a number too long for the room

    def _flat_items(self, node: list[Any], room: int) -> list[Any]:
        """``_items`` for a list of scalars, from its JSON text: no item holds a comma."""
        body = _json(node)
        end = body.rfind(b",", 0, max(1, room - self.slot))
        kept = node[: body.count(b",", 0, end) + 1] if end > 0 else []
        return [*kept, mark(len(body) - json_bytes(kept))]

    def mapping(self, node: dict[str, Any], room: int) -> dict[str, Any]:
        if self.size(node) <= room:
            return node

        def close(kept: list[tuple[str, Any]], rest: int) -> dict[str, Any]:
            out = dict(kept)
            key = MARK_KEY
            while key in out:
                key += MARK_KEY
            out[key] = mark(rest)
            return out

        pairs = list(node.items())
        return self._items(pairs, room - len(MARK_KEY.encode()) - 3, close, pair=True)

    def _items(
        self,
        items: list[Any],
        room: int,
        close: Callable[[list[Any], int], T],
        *,
        pair: bool = False,
    ) -> T:
        kept: list[Any] = []
        used = 2
        for index, item in enumerate(items):
            size = self._item_size(item, pair)
            left = room - used - (1 if kept else 0) - self.slot
            if size <= left:
                kept.append(item)
                used += size + (1 if len(kept) > 1 else 0)
                continue
            rest = items[index:]
            if left > self.slot + 8:
                part = self._part(item, left, pair)
                if part is not None:
                    kept.append(part)
                    rest = items[index + 1 :]
            return close(kept, sum(self._item_size(i, pair) + 1 for i in rest))
        return close(kept, 0)  # unreachable when the node was over its room

    def _item_size(self, item: Any, pair: bool) -> int:
        if pair:
            return json_bytes(item[0]) + 1 + self.size(item[1])
        return self.size(item)

    def _part(self, item: Any, room: int, pair: bool) -> Any:
        if not pair:
            return self.fit(item, room)
        key, value = item
        left = room - json_bytes(key) - 1
        return (key, self.fit(value, left)) if left > self.slot else None

    def spans(self, spans: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
        """Whole spans first come, first kept; a span over what is left keeps its fields and
        as much metadata as fits; then one last span of type `cut` stands for the rest."""
        if self.size(spans) <= room:
            return spans
        slot = json_bytes(_cut_span(10**12, 10**9)) + 1
        kept: list[dict[str, Any]] = []
        used = 2
        for index, span in enumerate(spans):
            left = room - used - (1 if kept else 0) - slot
            if self.size(span) <= left:
                kept.append(span)
                used += self.size(span) + (1 if len(kept) > 1 else 0)
                continue
            rest = spans[index:]
            bare = {**span, "metadata": {}}
            if json_bytes(bare) + self.slot * 2 < left:
                meta = self.mapping(span.get("metadata") or {}, left - json_bytes(bare) + 2)
                kept.append({**span, "metadata": meta})
                rest = spans[index + 1 :]
            return [*kept, _cut_span(self.rest(rest), len(rest))] if rest else kept
        return kept


def _references(roots: list[Any], shared: dict[str, Any]) -> list[str]:
    """The shared values reachable from ``roots``, in the order of their first use."""
    found: dict[str, None] = {}
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        if _is_ref(node):
            value_id = node[REF]
            if value_id in shared and value_id not in found:
                found[value_id] = None
                stack.append(shared[value_id])
        elif isinstance(node, list):
            if not _flat(node):
                stack += reversed(node)
        elif isinstance(node, dict):
            stack += reversed(node.values())
    return list(found)


def _fit_structure(doc: dict[str, Any], budget: int, total: int) -> dict[str, Any]:
    """The document cut first come, first kept: the fields in the order of TEXT_FIELDS and
    JSON_FIELDS, then the shared values they still reference, each with room kept for the
    smallest form of everything after it. A reference is kept whole or not at all."""
    fitter = _Fitter(total)
    smallest = {
        name: json_bytes([_cut_span(10**12, 10**9)])
        if name in SPAN_FIELDS
        else fitter.slot + _BRACKETS.get(_container(name), 0)
        for name in (*TEXT_FIELDS, *JSON_FIELDS)
    }
    order = [*TEXT_FIELDS, *JSON_FIELDS]
    skeleton = dict.fromkeys(order) | {SHARED: {}}
    room = budget - json_bytes(skeleton) + 4 * len(order)  # each null is replaced
    out: dict[str, Any] = {}
    for index, name in enumerate(order):
        later = sum(smallest[n] for n in order[index + 1 :])
        value = doc[name]
        here = room - later
        if value is None:
            fitted: Any = None
        elif name in SPAN_FIELDS and isinstance(value, list):
            fitted = fitter.spans(value, here)
        elif _container(name) is dict and isinstance(value, dict):
            fitted = fitter.mapping(value, here)
        else:
            fitted = fitter.fit(value, here)
        out[name] = fitted
        room -= json_bytes(fitted) - 4
    shared: dict[str, Any] = {}
    wanted = _references([out[n] for n in order], doc[SHARED])
    entry = ID_HEX_DIGITS + 4  # its quoted id, a colon and a comma
    for index, value_id in enumerate(wanted):
        later = (len(wanted) - index - 1) * (entry + fitter.slot)
        shared[value_id] = fitter.fit(doc[SHARED][value_id], room - later - entry)
        room -= entry + json_bytes(shared[value_id])
    # A value referenced only from parts that were cut away goes too.
    live = _references([out[n] for n in order], shared)
    out[SHARED] = {value_id: shared[value_id] for value_id in live}
    return out


@dataclass(frozen=True)
class RunCap:
    """The bytes one run may store, and why: the note on a cut run quotes ``why``."""

    limit: int
    why: str

    @classmethod
    def setting(cls, limit: int, name: str) -> RunCap:
        return cls(limit, f"a run stores at most {limit} bytes ({name})")


@dataclass
class PackedRun:
    """What is stored for one run: its fields, its shared values and its size in bytes."""

    fields: dict[str, Any]
    shared: dict[str, Any] = field(default_factory=dict)
    stored_bytes: int = 0
    cut_bytes: int = 0
    cut_places: int = 0


def _marks(doc: dict[str, Any]) -> tuple[int, int]:
    """(places, bytes) of the cut marks in a document, whoever made them (the runner shortens
    long strings in the container with the same mark)."""
    places = total = 0
    for text in _strings(doc):
        found = MARK.search(text)
        if found:
            places += 1
            total += int(found.group(1))
    return places, total


def _smallest(fields: dict[str, Any]) -> dict[str, Any]:
    """Every field at its smallest: what a cap too small for anything else still holds."""
    out: dict[str, Any] = {}
    for name in (*TEXT_FIELDS, *JSON_FIELDS):
        cut = mark(json_bytes(fields[name]))
        if name in TEXT_FIELDS:
            out[name] = None if fields[name] is None else cut
        elif name in SPAN_FIELDS:
            out[name] = [_cut_span(json_bytes(fields[name]), len(fields[name]))]
        else:
            container = _container(name)
            out[name] = [cut] if container is list else {MARK_KEY: cut} if container else cut
    return out | {SHARED: {}}


# What a list's or an object's smallest form adds to a mark: brackets, and the object's key.
_BRACKETS: dict[type | None, int] = {list: 2, dict: 8}


def _container(name: str) -> type | None:
    """list or dict when the field is one (it is stored as at least [] or {}), else None."""
    origin = get_origin(FIELD_TYPES[name])
    return origin if origin in (list, dict) else None


def _cut(fields: dict[str, Any], budget: int) -> dict[str, Any]:
    """The run's document within ``budget`` bytes, cut as little as this method can."""
    doc = _shared(fields)
    size = json_bytes(doc)
    if size <= budget:
        return doc
    marks = _mark_bytes(size)  # no mark counts more bytes than the whole
    level = _water_level(doc, budget, size)
    if level is not None:
        cut = _StringCut(level, marks).doc(doc)
        if json_bytes(cut) <= budget:
            return cut
    # The structure alone is too large: strings keep a short head, then containers keep
    # what fits.
    short = _StringCut(STRUCTURE_STRING_BYTES, marks).doc(doc)
    room = budget
    for _ in range(3):  # key collisions and shared values may overshoot a little: aim lower
        fitted = _fit_structure(short, room, size)
        over = json_bytes(fitted) - budget
        if over <= 0:
            return fitted
        room -= over + 64
    return _smallest(fields)


def pack_run(run: dict[str, Any], cap: RunCap) -> PackedRun:
    """A run's fields (TEXT_FIELDS and JSON_FIELDS of ``run``) as they are stored.

    RecursionError when the result nests too deeply to walk.
    """
    limit = max(cap.limit, MIN_STORED_RUN_BYTES)
    fields = {name: _storable(run.get(name), 0, escape=True) for name in JSON_FIELDS}
    for name in JSON_FIELDS:
        container = _container(name)
        if container is not None:
            fields[name] = fields[name] or container()
    for name in TEXT_FIELDS:
        text = run.get(name)
        fields[name] = None if text is None else storable_text(str(text))
    doc = _cut(fields, limit - NOTE_BYTES)
    places, cut = _marks(doc)
    if places:
        note = (
            f"[the stored result was cut: {cut} bytes in {places} place(s), each marked "
            f"…[N bytes cut]; {cap.why}]"
        )
        reason = doc["failure_reason"]
        doc["failure_reason"] = f"{reason} {note}" if reason else note
    stored = json_bytes(doc)
    shared = doc.pop(SHARED)
    return PackedRun(
        fields=doc, shared=shared, stored_bytes=stored, cut_bytes=cut, cut_places=places
    )


def stored_columns(invocation: Any, run: PackedRun) -> dict[str, Any]:
    """What the runs table stores of an invocation (anything with the contract's fields as
    attributes) packed as ``run``: its scalars (text made storable), its packed fields, its
    shared values and its size."""
    scalars = {name: getattr(invocation, name) for name in SCALAR_FIELDS}
    return {
        **{k: storable_text(v) if isinstance(v, str) else v for k, v in scalars.items()},
        **run.fields,
        SHARED: run.shared,
        "stored_bytes": run.stored_bytes,
    }


def read_back(row: Any) -> dict[str, Any]:
    """A stored run's fields (a row with the contract's fields as attributes), in the
    contract's order, as the run produced them: each shared value back where it stood."""
    shared = getattr(row, SHARED) or {}
    return {
        name: unpack(getattr(row, name), shared) if name in JSON_FIELDS else getattr(row, name)
        for name in FIELD_TYPES
    }
