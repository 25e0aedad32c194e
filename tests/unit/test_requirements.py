"""A bundle's requirements.txt is data: PEP 508 requirements, parsed before anything runs."""

from pathlib import Path

import pytest

from gate_service.bundles.requirements import parse_requirements, read_requirements
from gate_service.worker import handler


def messages(text: str | bytes) -> dict[int, str]:
    data = text.encode() if isinstance(text, str) else text
    report = parse_requirements(data)
    assert all(p["file"] == "requirements.txt" for p in report.problems)
    return {p["line"]: p["message"] for p in report.problems}


def test_plain_specifiers_extras_markers_and_comments_are_accepted() -> None:
    text = (
        "# deps\n"
        "requests>=2  # http\n"
        "\n"
        "   \n"
        "pydantic[email]==2.7; python_version >= '3.10'\n"
        "attrs >= 22, < 24 ; sys_platform == 'linux'\t# pinned\r\n"
        "PyYAML\n"
    )
    report = parse_requirements(text.encode())
    assert report.problems == []
    assert report.requirements == [
        "requests>=2",
        'pydantic[email]==2.7; python_version >= "3.10"',
        'attrs<24,>=22; sys_platform == "linux"',
        "PyYAML",
    ]


def test_missing_file_means_no_requirements(tmp_path: Path) -> None:
    report = read_requirements(tmp_path / "requirements.txt")
    assert (report.requirements, report.problems) == ([], [])


def test_a_byte_order_mark_cannot_smuggle_an_option() -> None:
    # pip strips the BOM and reads the rest as an option that builds sdists on the host.
    found = messages("\ufeff--no-binary=:all:\nrequests\n")
    assert list(found) == [1]
    assert "U+FEFF" in found[1] and "byte order mark" in found[1]
    assert "ASCII" in found[1]


@pytest.mark.parametrize(
    ("line", "option"),
    [
        ("-r other.txt", "-r"),
        ("-c constraints.txt", "-c"),
        ("-e .", "-e"),
        ("-e git+https://example.invalid/x.git#egg=x", "-e"),
        ("--requirement=other.txt", "--requirement"),
        ("--hash=sha256:" + "0" * 64, "--hash"),
        ("--index-url http://evil/simple", "--index-url"),
        ("-i http://evil/simple", "-i"),
        ("--extra-index-url=http://evil/simple", "--extra-index-url"),
        ("--find-links /tmp", "--find-links"),
        ("--no-binary=:all:", "--no-binary"),
        ("--trusted-host evil", "--trusted-host"),
        ("  --pre", "--pre"),
    ],
)
def test_every_option_form_is_refused(line: str, option: str) -> None:
    found = messages(f"ok==1\n{line}\n")
    assert list(found) == [2]
    assert f"options such as {option} are not allowed" in found[2]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("pkg @ https://example.invalid/pkg.whl", "URL"),
        ("pkg@file:///etc/passwd", "URL"),
        ("git+https://example.invalid/x.git", "URL"),
        ("https://example.invalid/pkg-1.0.tar.gz", "URL"),
        ("./local/pkg", "paths"),
        ("../pkg", "paths"),
        (".", "paths"),
        ("/abs/path/pkg.whl", "paths"),
        ("~/pkg", "paths"),
        ("vendor/pkg-1.0.tar.gz", "paths"),
        ("requests==${GATE_DATABASE_URL}", "environment variables"),
        ("$HOME", "environment variables"),
        ("requests \\", "backslash"),
        ("requests==1 extra", "not a PEP 508 requirement"),
        ("foo==", "not a PEP 508 requirement"),
        ("requests\x00", "control character 0x00"),
        # Valid PEP 508 names that pip would open as files relative to its working directory.
        ("x-1.0-py3-none-any.whl", "read by pip as a file"),
        ("evil-1.0.tar.gz", "read by pip as a file"),
        ("pkg.zip[extra]", "read by pip as a file"),
        ("EVIL.TGZ==1", "read by pip as a file"),
    ],
)
def test_urls_paths_variables_continuations_and_junk_are_refused(line: str, why: str) -> None:
    found = messages(f"ok==1\n{line}\n")
    assert list(found) == [2], found
    assert why in found[2]


def test_non_ascii_is_refused_and_named() -> None:
    found = messages("caf\u00e9==1\n# \u201ccomment\u201d\n".encode() + b"\xff\n")
    assert "U+00E9" in found[1] and "column 4" in found[1]
    assert "U+201C" in found[2]  # even in a comment: the file is plain ASCII
    assert "byte 0xff" in found[3]


def test_every_bad_line_is_reported_not_only_the_first() -> None:
    text = "\ufeff--no-binary=:all:\nok==1\n-e .\nx @ https://e.invalid/x.whl\n# fine\n$X\n"
    report = parse_requirements(text.encode())
    assert [p["line"] for p in report.problems] == [1, 3, 4, 6]
    assert report.requirements == ["ok==1"]


def test_a_continuation_cannot_join_two_lines() -> None:
    found = messages("requests\\\n--index-url http://evil\n")
    assert sorted(found) == [1, 2]


def test_the_test_image_tag_carries_the_full_bundle_sha() -> None:
    sha = "ab" * 32
    tag = handler.test_image_tag(sha, "gate-runner:0123456789ab")
    assert tag == f"gate-test:{sha}-0123456789ab"
