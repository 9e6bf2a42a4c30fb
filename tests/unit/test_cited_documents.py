"""Every document the repository's files cite is one the repository holds, down to the cited section.

Code, tests, benchmarks and docs cite `docs/<name>.md`, sections of docs/protocol.md ("docs/protocol.md
§2.4"; in Python files a bare "§2.4" means the same), and headings ('docs/architecture.md, "Exactly
once"'), and markdown files link to each other's headings. A citation of a design note kept
outside the repository, or of a section that was renumbered away, leaves a reader with nothing to
open; these tests name each such line.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve().relative_to(REPOSITORY).as_posix()
PROTOCOL = "docs/protocol.md"

# Notes that never shipped with the project; what they said is in docs/ now.
OUTSIDE_NOTES = re.compile(r"DESIGN\.md|kcl-spec|STACK\.md|\.\./shared")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/([\w-]+)\.md")
PROTOCOL_SECTIONS = re.compile(r"docs/protocol\.md((?:,? §[\d.]+(?:-[\d.]+)?)+)")
SECTION = re.compile(r"§(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?")
QUOTED_HEADING = re.compile(r"(?<![\w/.-])((?:docs/)?[\w-]+\.md), \"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.MULTILINE)
MARKDOWN_LINK = re.compile(r"\]\((?!https?:)([^)\s#]*\.md)?(?:#([^)\s]+))?\)")
NUMBERED_HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)


@cache
def tracked_text_files() -> dict[str, str]:
    """Path -> text of every tracked file that is text, except this test (which must name the notes)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPOSITORY, capture_output=True, check=True, text=True
    ).stdout
    texts = {}
    for path in filter(None, listing.split("\0")):
        if path == THIS_FILE or not (REPOSITORY / path).is_file():
            continue
        try:
            texts[path] = (REPOSITORY / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images and other binary files cite nothing
    return texts


def citing_lines(pattern: re.Pattern[str]) -> list[tuple[str, int, re.Match[str]]]:
    return [
        (path, number, match)
        for path, text in tracked_text_files().items()
        for number, line in enumerate(text.splitlines(), start=1)
        for match in pattern.finditer(line)
    ]


@cache
def protocol_sections() -> frozenset[str]:
    return frozenset(NUMBERED_HEADING.findall((REPOSITORY / PROTOCOL).read_text(encoding="utf-8")))


def missing_sections(citation: str) -> list[str]:
    """The section numbers `citation` names (both ends of a range) that docs/protocol.md lacks."""
    cited = [number for match in SECTION.finditer(citation) for number in match.groups() if number]
    return [number for number in cited if number not in protocol_sections()]


def _is_cited_as(heading: str, cited: str) -> bool:
    """The whole heading, or its part before a colon ("Memory" for "Memory: a slot's peak RSS ...")."""
    return cited in (heading, heading.split(":", 1)[0])


def test_no_file_cites_a_design_note_kept_outside_the_repository() -> None:
    offending = [f"{path}:{number}: {match.group(0)}" for path, number, match in citing_lines(OUTSIDE_NOTES)]
    assert not offending, "cite docs/*.md instead of notes the repository does not hold:\n" + "\n".join(offending)


def test_every_cited_docs_file_exists() -> None:
    missing = [
        f"{path}:{number}: {match.group(0)}"
        for path, number, match in citing_lines(DOCS_PATH)
        if not (REPOSITORY / "docs" / f"{match.group(1)}.md").is_file()
    ]
    assert not missing, "these lines cite a docs file the repository does not hold:\n" + "\n".join(missing)


def test_every_cited_protocol_section_exists() -> None:
    missing = [
        f"{path}:{number}: {match.group(0)} (no §{', §'.join(absent)})"
        for path, number, match in citing_lines(PROTOCOL_SECTIONS)
        if (absent := missing_sections(match.group(1)))
    ]
    assert not missing, f"these lines cite sections {PROTOCOL} does not have:\n" + "\n".join(missing)


def test_section_numbers_in_python_files_and_in_the_protocol_itself_name_protocol_sections() -> None:
    """A bare "§2.4" in code continues a citation of docs/protocol.md; inside that file it is a cross-reference."""
    missing = [
        f"{path}:{number}: {match.group(0)}"
        for path, number, match in citing_lines(SECTION)
        if (path.endswith(".py") or path == PROTOCOL) and missing_sections(match.group(0))
    ]
    assert not missing, f"these section numbers are not sections of {PROTOCOL}:\n" + "\n".join(missing)


def test_every_quoted_heading_of_a_cited_document_exists() -> None:
    missing = []
    for path, number, match in citing_lines(QUOTED_HEADING):
        document, heading = match.groups()
        # Inside docs/, a bare name is a sibling; elsewhere it is relative to the repository.
        base = REPOSITORY / "docs" if path.startswith("docs/") and "/" not in document else REPOSITORY
        target = base / document
        if not target.is_file():
            missing.append(f"{path}:{number}: {document} does not exist")
        elif not any(_is_cited_as(found, heading) for found in HEADING.findall(target.read_text(encoding="utf-8"))):
            missing.append(f"{path}:{number}: {document} has no heading {heading!r}")
    assert not missing, "these lines cite headings that do not exist:\n" + "\n".join(missing)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_markdown_files_reaches_its_file_and_heading() -> None:
    broken = []
    for path, number, match in citing_lines(MARKDOWN_LINK):
        if not path.endswith(".md") or (match.group(1) is None and match.group(2) is None):
            continue
        target = (REPOSITORY / path).parent / match.group(1) if match.group(1) else REPOSITORY / path
        if not target.is_file():
            broken.append(f"{path}:{number}: {match.group(0)}: no such file")
        elif match.group(2) and match.group(2) not in map(anchor, HEADING.findall(target.read_text(encoding="utf-8"))):
            broken.append(f"{path}:{number}: {match.group(0)}: no such heading")
    assert not broken, "these links lead nowhere:\n" + "\n".join(broken)


def test_a_heading_anchor_is_spelled_as_github_spells_it() -> None:
    assert anchor("State: three DynamoDB tables per application") == "state-three-dynamodb-tables-per-application"
    assert anchor("Where the code of `lease_core` lives") == "where-the-code-of-lease_core-lives"


def test_a_citation_of_an_absent_protocol_section_is_found() -> None:
    assert missing_sections(" §2.4-2.5, §99.1") == ["99.1"]
    assert not missing_sections(" §0, §4, §3.10")


def test_a_heading_is_cited_whole_or_by_its_part_before_a_colon() -> None:
    assert _is_cited_as("Memory: a slot's peak RSS", "Memory")
    assert _is_cited_as("Exactly once", "Exactly once")
    assert not _is_cited_as("Where the code of `sinks` lives", "Where the code lives")
