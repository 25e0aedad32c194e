"""A bundle's requirements.txt: plain specifiers only."""

from pathlib import Path

import pytest

from gate_service.worker.handler import BundleRejected, requirement_lines


def lines_of(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "requirements.txt"
    path.write_text(text)
    return requirement_lines(path)


def test_plain_specifiers_comments_and_markers(tmp_path: Path) -> None:
    text = "# deps\nrequests>=2  # http\n\npydantic[email]==2.7; python_version >= '3.10'\n"
    assert lines_of(tmp_path, text) == [
        "requests>=2",
        "pydantic[email]==2.7; python_version >= '3.10'",
    ]


def test_missing_file_means_no_requirements(tmp_path: Path) -> None:
    assert requirement_lines(tmp_path / "requirements.txt") == []


@pytest.mark.parametrize(
    "line",
    [
        "--index-url http://evil/simple",
        "-r other.txt",
        "-e .",
        "git+https://example.invalid/x.git",
        "pkg @ https://example.invalid/pkg.whl",
        "./local/pkg",
        "/abs/path/pkg.whl",
        "requests==${GATE_DATABASE_URL}",
    ],
)
def test_options_urls_and_paths_are_refused(tmp_path: Path, line: str) -> None:
    with pytest.raises(BundleRejected, match="line 2"):
        lines_of(tmp_path, f"ok==1\n{line}\n")
