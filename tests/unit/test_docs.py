"""The README stays true: every setting is documented, and the runner contract agrees."""

from pathlib import Path

from gate_runner.contract import BEGIN_MARKER, END_MARKER
from gate_runner.contract import SCHEMA_VERSION as RUNNER_SCHEMA_VERSION
from gate_service import runner_contract
from gate_service.config import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_in_the_readme_table() -> None:
    missing = [
        f"GATE_{name.upper()}"
        for name in Settings.model_fields
        if f"`GATE_{name.upper()}" not in README
    ]
    assert missing == []


def test_runner_and_service_share_the_contract_version_and_markers() -> None:
    assert RUNNER_SCHEMA_VERSION == runner_contract.SCHEMA_VERSION
    assert BEGIN_MARKER.encode() == runner_contract.BEGIN_MARKER
    assert END_MARKER.encode() == runner_contract.END_MARKER


def test_the_readme_and_the_service_name_the_contracts_version() -> None:
    # runner_contract.py once said v1 while the schema was 2.
    def words(text: str | None) -> str:
        return " ".join((text or "").split())

    assert f"contract v{RUNNER_SCHEMA_VERSION}" in words(README)
    assert f"schema v{RUNNER_SCHEMA_VERSION}" in words(runner_contract.__doc__)
