"""Predefined tools in a gate: a per-invocation document store with Mongo-style filters,
a retrieval store, and the SDK's `from connic.tools import ...` names reaching them."""

from pathlib import Path

import pytest

from gate_runner.predefined import DocumentStore, RetrievalStore, matches
from gate_runner.runtime_errors import AgentRunError
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

DOC = {
    "name": "Ada",
    "age": 36,
    "tags": ["math", "poetry"],
    "address": {"city": "London"},
    "orders": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 5}],
}


@pytest.mark.parametrize(
    ("flt", "hit"),
    [
        ({"name": "Ada"}, True),
        ({"address.city": "London"}, True),
        ({"age": {"$gt": 30, "$lte": 36}}, True),
        ({"age": {"$lt": 30}}, False),
        ({"name": {"$in": ["Ada", "Bob"]}}, True),
        ({"name": {"$nin": ["Ada"]}}, False),
        ({"missing": {"$ne": 1}}, True),  # $ne matches a missing field
        ({"missing": {"$nin": [1]}}, True),
        ({"missing": {"$exists": False}}, True),
        ({"name": {"$regex": "^ad"}}, True),  # case-insensitive
        ({"tags": {"$contains": "math"}}, True),
        ({"tags": "poetry"}, True),
        ({"orders": {"$elemMatch": {"sku": "b", "qty": {"$gte": 5}}}}, True),
        ({"$or": [{"name": "Bob"}, {"age": 36}]}, True),
        ({"$nor": [{"name": "Ada"}]}, False),
        ({"$and": [{"name": "Ada"}, {"age": {"$not": {"$gt": 40}}}]}, True),
        ({"age": {"$gt": "x"}}, False),  # a type mismatch is no match, not a crash
    ],
)
def test_filters(flt: dict[str, object], hit: bool) -> None:
    assert matches(DOC, flt) is hit


def test_document_store_contract() -> None:
    db = DocumentStore()
    inserted = db.db_insert("people", [{"name": "Ada", "age": 36}, {"name": "Bob", "age": 20}])
    assert inserted["inserted_count"] == 2
    assert {"_id", "_created_at", "_updated_at"} <= set(inserted["inserted"][0])
    found = db.db_find("people", {"age": {"$gte": 21}}, fields=["name"])
    assert found["count"] == 1 and set(found["documents"][0]) == {"_id", "name"}
    assert db.db_find("people", sort={"age": 1})["documents"][0]["name"] == "Bob"
    assert db.db_find("people", distinct="name") == {"values": ["Ada", "Bob"], "count": 2}
    assert (
        db.db_update("people", {"name": "Ada"}, {"age": None, "city": "London"})["updated_count"]
        == 1
    )
    assert "age" not in db.db_find("people", {"name": "Ada"})["documents"][0]  # None removes
    assert db.db_upsert("people", {"name": "Cy"}, {"age": 5})["operation"] == "inserted"
    assert db.db_upsert("people", {"name": "Cy"}, {"age": 6})["operation"] == "updated"
    assert db.db_count("people") == {"count": 3}
    with pytest.raises(AgentRunError, match="non-empty filter"):
        db.db_delete("people", {})
    assert db.db_delete("people", {"name": "Bob"})["deleted_count"] == 1
    assert db.db_list_collections()["collections"][0]["document_count"] == 2


def test_retrieval_store_scores_word_overlap() -> None:
    store = RetrievalStore()
    store.retrieval_store("refund policy for damaged goods", namespace="policies.refunds")
    store.retrieval_store("shipping times to Europe", namespace="policies.shipping")
    results = store.retrieval_query("damaged goods refund", min_score=0.2)["results"]
    assert [r["namespace"] for r in results] == ["policies.refunds"]
    assert store.retrieval_list_namespaces() == {"namespaces": ["policies"]}
    assert store.retrieval_delete(namespace="policies.shipping")["deleted_chunks"] == 1


def test_user_code_importing_connic_tools_reaches_the_gate_store(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/crm.yaml": """
            version: "1.0"
            name: crm
            description: Stores a customer, then counts.
            type: tool
            tool_name: crm.add_customer
        """,
            "tools/crm.py": """
            from connic.tools import db_count, db_insert


            async def add_customer(payload: dict) -> dict:
                await db_insert("customers", {"name": payload["name"]})
                await db_insert("customers", {"name": "second"})
                return await db_count("customers")
        """,
            "tests/crm.yaml": """
            tests:
              - name: counts_only_this_invocations_rows
                payload: '{"name": "Ada"}'
                runs: 2
                expected_result: output.count == 2
        """,
        },
    )
    result = judged(project, "tests/crm.yaml", "counts_only_this_invocations_rows")
    assert result.passed, result.failure_reason


def test_db_find_sorts_numbers_as_numbers_and_types_in_mongodbs_order() -> None:
    store = DocumentStore()
    values: list[object] = [9, "b", 10, None, 2.5, "a", True, [1], {"k": 1}]
    store.db_insert("c", [{"v": v} for v in values] + [{"other": 1}])
    found = store.db_find("c", sort={"v": 1})["documents"]
    assert [d.get("v", "missing") for d in found] == [
        None, "missing", 2.5, 9, 10, "a", "b", {"k": 1}, [1], True,
    ]  # fmt: skip
    newest_first = store.db_find("c", filter={"v": {"$gt": 0}}, sort={"v": -1})["documents"]
    assert [d["v"] for d in newest_first] == [10, 9, 2.5]


def test_the_model_is_told_what_each_predefined_tool_does(tmp_path: Path) -> None:
    # The SDK's loader leaves a predefined tool's description empty; the model gets the
    # first paragraph of the SDK stub's docstring instead.
    root = write(
        tmp_path / "p",
        {
            "agents/asker.yaml": """
                version: "1.0"
                name: asker
                description: Lists what it is offered.
                model: openai/gpt-4o
                system_prompt: List.
                tools: [db_find, trigger_agent]
            """,
            "tests/models/asker.py": """
                import json


                def respond(messages, tools, context):
                    return {"content": json.dumps({t["function"]["name"]: t["function"]["description"]
                                                   for t in tools})}
            """,
            "tests/asker.yaml": """
                tests:
                  - name: lists
                    payload: go
                    expected_result: output.db_find == "Query documents from a database collection using JSON filters."
            """,
        },
    )
    result = judged(root, "tests/asker.yaml", "lists")
    assert result.passed, result.failure_reason
