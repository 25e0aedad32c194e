"""Predefined tools (spec §3.2) as they run in a gate.

A gate has no tenant database, retrieval index or search provider, so each invocation gets
its own in-memory document store and retrieval store: tools, child agents, builders and
cleanup of one invocation share them, and nothing leaks into the next invocation. The
behaviour follows the documented contracts (Mongo-style filters, system fields, result
shapes); retrieval scores by word overlap instead of embeddings, and web tools need the
gate to give case containers a network.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from .ids import uuid4_text
from .runtime_errors import AgentRunError

MAX_IN = 1000
_MISSING = object()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(doc, Mapping) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return _MISSING
    return doc


def _compare(op: str, value: Any, arg: Any) -> bool:
    # As MongoDB's comparisons, a boolean is not a number: True is not greater than 0.
    if isinstance(value, bool) != isinstance(arg, bool):
        return False
    try:
        if op == "$gt":
            return value is not _MISSING and bool(value > arg)
        if op == "$gte":
            return value is not _MISSING and bool(value >= arg)
        if op == "$lt":
            return value is not _MISSING and bool(value < arg)
        if op == "$lte":
            return value is not _MISSING and bool(value <= arg)
    except TypeError:
        return False
    raise AgentRunError(f"unknown filter operator {op}")


def _match_value(value: Any, cond: Any) -> bool:
    if not (isinstance(cond, Mapping) and cond and all(str(k).startswith("$") for k in cond)):
        if isinstance(value, list) and not isinstance(cond, list):
            return cond in value
        return value is not _MISSING and value == cond
    for op, arg in cond.items():
        if op == "$eq":
            ok = value is not _MISSING and value == arg
        elif op == "$ne":
            ok = value is _MISSING or value != arg  # spec: $ne matches missing fields too
        elif op in ("$gt", "$gte", "$lt", "$lte"):
            ok = _compare(op, value, arg)
        elif op in ("$in", "$nin"):
            if not isinstance(arg, list) or len(arg) > MAX_IN:
                raise AgentRunError(f"{op} takes a list of at most {MAX_IN} values")
            hit = value is not _MISSING and (
                any(v in arg for v in value) if isinstance(value, list) else value in arg
            )
            ok = hit if op == "$in" else not hit
        elif op == "$exists":
            ok = (value is not _MISSING) == bool(arg)
        elif op == "$regex":
            ok = isinstance(value, str) and re.search(str(arg), value, re.IGNORECASE) is not None
        elif op == "$contains":
            ok = isinstance(value, list | str) and arg in value
        elif op == "$elemMatch":
            ok = isinstance(value, list) and any(
                matches(v, arg) if isinstance(v, Mapping) else _match_value(v, arg) for v in value
            )
        elif op == "$not":
            ok = not _match_value(value, arg)
        else:
            raise AgentRunError(f"unknown filter operator {op}")
        if not ok:
            return False
    return True


def matches(doc: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Mongo-style filter: field conditions with dot paths plus $and / $or / $nor."""
    for key, cond in (flt or {}).items():
        if key == "$and":
            if not all(matches(doc, f) for f in cond):
                return False
        elif key == "$or":
            if not any(matches(doc, f) for f in cond):
                return False
        elif key == "$nor":
            if any(matches(doc, f) for f in cond):
                return False
        elif str(key).startswith("$"):
            raise AgentRunError(f"unknown filter operator {key}")
        elif not _match_value(_get(doc, key), cond):
            return False
    return True


def _sort_key(path: str) -> Callable[[Mapping[str, Any]], tuple[int, Any]]:
    """MongoDB's order across types (missing and null, numbers, strings, objects, arrays,
    booleans), each type by its own order: numbers as numbers, not as their text."""

    def key(doc: Mapping[str, Any]) -> tuple[int, Any]:
        value = _get(doc, path)
        if value is _MISSING or value is None:
            return (0, 0)
        if isinstance(value, bool):
            return (5, value)
        if isinstance(value, int | float):
            return (1, value)
        if isinstance(value, str):
            return (2, value)
        text = json.dumps(value, default=str, sort_keys=True)
        return (4, text) if isinstance(value, list) else (3, text)

    return key


class DocumentStore:
    def __init__(self) -> None:
        self.collections: dict[str, list[dict[str, Any]]] = {}

    def _docs(self, collection: str) -> list[dict[str, Any]]:
        if not isinstance(collection, str) or not collection:
            raise AgentRunError("collection must be a non-empty string")
        return self.collections.setdefault(collection, [])

    def db_find(
        self,
        collection: str,
        filter: dict[str, Any] | None = None,
        sort: dict[str, int] | None = None,
        limit: int = 100,
        skip: int = 0,
        fields: list[str] | None = None,
        distinct: str | None = None,
    ) -> dict[str, Any]:
        docs = [d for d in self._docs(collection) if matches(d, filter)]
        if distinct:
            values: list[Any] = []
            for d in docs:
                v = _get(d, distinct)
                if v is not _MISSING and v not in values:
                    values.append(v)
            return {"values": values, "count": len(values)}
        for key, direction in reversed(list((sort or {}).items())):
            docs.sort(key=_sort_key(key), reverse=direction < 0)
        limit = max(0, min(int(limit), 1000))
        page = docs[int(skip) : int(skip) + limit]
        if fields:
            page = [{k: d[k] for k in ("_id", *fields) if k in d} for d in page]
        return {"documents": copy.deepcopy(page), "count": len(page)}

    def db_insert(
        self, collection: str, documents: dict[str, Any] | list[dict[str, Any]]
    ) -> dict[str, Any]:
        batch = documents if isinstance(documents, list) else [documents]
        inserted = []
        for doc in batch:
            if not isinstance(doc, dict):
                raise AgentRunError("documents must be objects")
            stamp = _now()
            stored = {
                **copy.deepcopy(doc),
                "_id": str(doc.get("_id") or uuid4_text()),
                "_created_at": stamp,
                "_updated_at": stamp,
            }
            self._docs(collection).append(stored)
            inserted.append(copy.deepcopy(stored))
        return {"inserted": inserted, "inserted_count": len(inserted)}

    @staticmethod
    def _apply(doc: dict[str, Any], update: Mapping[str, Any]) -> None:
        for key, value in update.items():
            if value is None:
                doc.pop(key, None)  # spec: setting a field to None removes it
            else:
                doc[key] = copy.deepcopy(value)
        doc["_updated_at"] = _now()

    def db_update(
        self, collection: str, filter: dict[str, Any], update: dict[str, Any]
    ) -> dict[str, Any]:
        ids = []
        for doc in self._docs(collection):
            if matches(doc, filter):
                self._apply(doc, update)
                ids.append(doc["_id"])
        return {"updated_ids": ids, "updated_count": len(ids)}

    def db_upsert(
        self,
        collection: str,
        filter: dict[str, Any],
        update: dict[str, Any],
        insert_only: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        for doc in self._docs(collection):
            if matches(doc, filter):
                self._apply(doc, update)
                return {"upserted_id": doc["_id"], "operation": "updated"}
        seed = {
            k: v
            for k, v in (filter or {}).items()
            if not str(k).startswith("$") and not isinstance(v, Mapping)
        }
        created = self.db_insert(collection, {**seed, **(insert_only or {}), **update})
        return {"upserted_id": created["inserted"][0]["_id"], "operation": "inserted"}

    def db_delete(self, collection: str, filter: dict[str, Any]) -> dict[str, Any]:
        if not filter:
            raise AgentRunError("db_delete needs a non-empty filter")
        docs = self._docs(collection)
        gone = [d["_id"] for d in docs if matches(d, filter)]
        self.collections[collection] = [d for d in docs if d["_id"] not in gone]
        return {"deleted_ids": gone, "deleted_count": len(gone)}

    def db_count(self, collection: str, filter: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"count": sum(1 for d in self._docs(collection) if matches(d, filter))}

    def db_list_collections(self) -> dict[str, Any]:
        items = [
            {
                "name": name,
                "document_count": len(docs),
                "size_bytes": len(json.dumps(docs, default=str)),
            }
            for name, docs in sorted(self.collections.items())
        ]
        return {"collections": items, "total": len(items)}


_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


class RetrievalStore:
    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def retrieval_store(
        self,
        content: str,
        entry_id: str | None = None,
        namespace: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        entry_id = entry_id or uuid4_text()
        self.entries[entry_id] = {
            "entry_id": entry_id,
            "content": content,
            "namespace": namespace,
            "metadata": dict(metadata or {}),
        }
        # Indexing is asynchronous on the platform; here it is immediate.
        return {
            "entry_id": entry_id,
            "job_id": uuid4_text(),
            "status": "pending",
            "queued": True,
            "success": True,
        }

    def retrieval_query(
        self,
        query: str,
        namespace: str | None = None,
        min_score: float = 0.3,
        max_results: int = 3,
        metadata_filter: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        asked = _words(query)
        scored = []
        for e in self.entries.values():
            if namespace and not str(e["namespace"] or "").startswith(namespace):
                continue
            if metadata_filter and not matches(e["metadata"], metadata_filter):
                continue
            have = _words(e["content"])
            score = len(asked & have) / len(asked | have) if asked | have else 0.0
            if score >= min_score:
                scored.append({**e, "score": round(score, 4)})
        scored.sort(key=lambda r: -r["score"])
        return {"results": scored[: max(1, min(int(max_results), 20))]}

    def retrieval_delete(
        self,
        entry_id: str | None = None,
        namespace: str | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if metadata_filter and not namespace:
            raise AgentRunError("retrieval_delete: a metadata filter requires a namespace")
        gone = [
            k
            for k, e in self.entries.items()
            if (entry_id is None or k == entry_id)
            and (namespace is None or e["namespace"] == namespace)
            and (not metadata_filter or matches(e["metadata"], metadata_filter))
        ]
        for k in gone:
            del self.entries[k]
        return {"ok": True, "deleted_chunks": len(gone)}

    def retrieval_list_namespaces(
        self, parent: str | None = None, depth: int = 1
    ) -> dict[str, Any]:
        names = sorted({str(e["namespace"]) for e in self.entries.values() if e["namespace"]})
        if parent:
            names = [n for n in names if n == parent or n.startswith(parent + ".")]
        if depth:
            base = len(parent.split(".")) if parent else 0
            names = sorted({".".join(n.split(".")[: base + depth]) for n in names})
        return {"namespaces": names}


def web_search(
    query: str, max_results: int = 5, country: str | None = None, include_news: bool = False
) -> dict[str, Any]:
    raise AgentRunError("web_search needs a search provider, and a gate has none")


def page_answer(fetched: dict[str, Any]) -> dict[str, Any]:
    """web_read_page's answer from a page the gateway fetched (FetchReply.raw()["fetch"])."""
    if fetched.get("redirect_url"):
        return {"error": "redirect", "redirect_url": fetched["redirect_url"], "url": fetched["url"]}
    return {"markdown": str(fetched.get("text") or ""), "url": fetched.get("url")}


def web_read_page(url: str, follow_redirects: bool = True) -> dict[str, Any]:
    import httpx

    try:
        response = httpx.get(url, follow_redirects=follow_redirects, timeout=20)
    except httpx.HTTPError as exc:
        raise AgentRunError(
            f"web_read_page {url}: {exc} (case containers have no network "
            "unless the gate configures one)"
        ) from None
    if response.is_redirect and not follow_redirects:
        return {"error": "redirect", "redirect_url": response.headers.get("location"), "url": url}
    return {"markdown": page_text(response.text), "url": str(response.url)}


def page_text(html: str) -> str:
    """A page as web_read_page answers it when the runner fetches it itself: its text, in
    time linear in the page (gate_runner/html_text.py; the gateway parses the pages it
    fetches with libxml2 and answers the same text, gate_service/gateway/pages.py)."""
    from .html_text import page_text as text

    return text(html)


ALIASES = {
    "query_knowledge": "retrieval_query",
    "store_knowledge": "retrieval_store",
    "delete_knowledge": "retrieval_delete",
    "kb_list_namespaces": "retrieval_list_namespaces",
}


class Predefined:
    """The predefined tools of one invocation, by name."""

    def __init__(self) -> None:
        self.db = DocumentStore()
        self.retrieval = RetrievalStore()
        # How web_read_page reads a page: directly (a case with a network), unless the
        # runtime routes it through the model gateway or the recordings (Runtime.web_page).
        self.read_page: Callable[[str, bool], dict[str, Any]] = web_read_page

    def get(self, name: str) -> Callable[..., Any] | None:
        name = ALIASES.get(name, name)
        for owner in (self.db, self.retrieval):
            if name.startswith(("db_", "retrieval_")) and hasattr(owner, name):
                return getattr(owner, name)  # type: ignore[no-any-return]
        web: dict[str, Callable[..., Any]] = {
            "web_search": web_search,
            "web_read_page": lambda url, follow_redirects=True: self.read_page(
                url, follow_redirects
            ),
        }
        return web.get(name)
