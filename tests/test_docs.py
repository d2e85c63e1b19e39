"""The documentation follows the code: README.md is the entrance and docs/ the reference, an MkDocs site
that `make docs` builds with `mkdocs build --strict` (a link to a page or a section of docs/ that is not
there fails it). Here: every `bergstream` command they show exists with the options they give it, and
README's links into docs/ reach a page and a section of it."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import click

from bergstream.cli import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*$", re.MULTILINE)


def _commands(text: str) -> list[str]:
    """The command lines of a Markdown text: those of its code blocks that run `bergstream` (continuation
    lines joined, comments left out), and its code spans that start with `bergstream` or one of its
    command groups (`router run --available-now`)."""
    found = []
    for index, part in enumerate(FENCE.split(text)):
        if index % 2:  # a code block
            for line in part.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s#.*", "", line)
                match = re.search(r"(?:^|\s)(bergstream\s.*)", line)
                if match:
                    found.append(match.group(1))
            continue
        for span in re.findall(r"`([^`]+)`", part):
            words = span.split()
            if len(words) > 1 and words[0] == "bergstream":
                found.append(" ".join(words))
            elif len(words) > 1 and words[0] in cli.commands:
                found.append(" ".join(["bergstream", *words]))
    return found


def _wrong(line: str) -> str | None:
    """What in a command line names no command or option of `bergstream`, if anything."""
    words = line.split()[1:]
    command: click.Command = cli
    path = ["bergstream"]
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        command = command.commands[words[0]]
        path.append(words.pop(0))
    if isinstance(command, click.Group):
        # A group named alone (`bergstream router`) is fine; a word after it must be one of its commands.
        return f"{' '.join(path)} has no command {words[0]!r}" if words else None
    options = {option for parameter in command.params for option in parameter.opts} | {"--help"}
    given = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", " ".join(words))
    unknown = [option for option in given if option not in options]
    return f"{' '.join(path)} has no option {', '.join(unknown)}" if unknown else None


def test_every_command_shown_exists_with_its_options() -> None:
    wrong, shown = [], 0
    for page in PAGES:
        for line in _commands(page.read_text()):
            shown += 1
            problem = _wrong(line)
            if problem:
                wrong.append(f"{page.relative_to(ROOT)}: `{line}`: {problem}")
    assert shown > 50, f"only {shown} commands found in README.md and docs/: the search is broken"
    assert not wrong, "\n".join(wrong)


def _slug(heading: str) -> str:
    """A heading's anchor, as MkDocs makes it (Python-Markdown's toc)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    prose = FENCE.split(page.read_text())[::2]
    return {_slug(heading) for part in prose for heading in re.findall(r"^#+ (.+)$", part, re.MULTILINE)}


def test_readmes_links_reach_a_page_of_docs_and_its_section() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", (ROOT / "README.md").read_text())
    assert links, "README.md links to no page of docs/"
    broken = []
    for target, anchor in links:
        page = ROOT / target
        if not page.is_file():
            broken.append(f"{target}: no such page")
        elif anchor and anchor not in _anchors(page):
            broken.append(f"{target}#{anchor}: no such section")
    assert not broken, f"README.md links to {broken}"
    # Every page but the site's own first one is on README's map.
    pages = {str(page.relative_to(ROOT)) for page in PAGES[1:]} - {"docs/index.md"}
    unlinked = sorted(pages - {target for target, _ in links})
    assert not unlinked, f"README.md's map of docs/ leaves out {unlinked}"
