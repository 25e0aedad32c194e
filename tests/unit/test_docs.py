"""The docs stay true: every setting is documented, the runner contract agrees, the README is
a front door that links every page of docs/, and no page links a file that is not there."""

import re
from pathlib import Path

from gate_runner.contract import BEGIN_MARKER, END_MARKER
from gate_runner.contract import SCHEMA_VERSION as RUNNER_SCHEMA_VERSION
from gate_service import docs_tables, runner_contract
from gate_service.config import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS_PAGE = (ROOT / "docs" / "settings.md").read_text()
HOW_A_GATE_RUNS = (ROOT / "docs" / "how-a-gate-runs.md").read_text()
# A front door: what, the two commands, the first token, a pipeline example, the links.
README_MAX_LINES = 300


def test_every_setting_is_in_the_settings_page() -> None:
    missing = [
        f"GATE_{name.upper()}"
        for name in Settings.model_fields
        if f"`GATE_{name.upper()}" not in SETTINGS_PAGE
    ]
    assert missing == []


def test_runner_and_service_share_the_contract_version_and_markers() -> None:
    assert RUNNER_SCHEMA_VERSION == runner_contract.SCHEMA_VERSION
    assert BEGIN_MARKER.encode() == runner_contract.BEGIN_MARKER
    assert END_MARKER.encode() == runner_contract.END_MARKER


def test_the_docs_and_the_service_name_the_contracts_version() -> None:
    # runner_contract.py once said v1 while the schema was 2.
    def words(text: str | None) -> str:
        return " ".join((text or "").split())

    assert f"contract v{RUNNER_SCHEMA_VERSION}" in words(HOW_A_GATE_RUNS)
    assert f"schema v{RUNNER_SCHEMA_VERSION}" in words(runner_contract.__doc__)


def test_the_readme_is_a_front_door_linking_every_page() -> None:
    assert len(README.splitlines()) <= README_MAX_LINES
    for heading in ("## The two commands", "## In a pipeline", "## Where everything else is"):
        assert heading in README, heading
    assert "The first token" in README
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in README, f"README does not link docs/{page.name}"


def test_no_page_links_a_file_that_is_not_there() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links {target}"


def test_the_generated_tables_are_what_the_code_says() -> None:
    # docs/settings.md from Settings, docs/support.md from bundles/support.py: a setting or a
    # support row changed without `python -m gate_service.docs_tables` fails here.
    assert docs_tables.stale() == []


def test_the_check_fails_when_a_page_differs(tmp_path: Path) -> None:
    for page in docs_tables.TABLES:
        (tmp_path / page).write_text((ROOT / "docs" / page).read_text())
    settings = tmp_path / docs_tables.SETTINGS_PAGE
    settings.write_text(settings.read_text().replace("`GATE_PORT` | `8080`", "`GATE_PORT` | `80`"))
    assert docs_tables.stale(tmp_path) == [docs_tables.SETTINGS_PAGE]
