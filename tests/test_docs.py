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


def _layout_rows() -> list[tuple[str, list[str], str]]:
    """docs/layout.md's table: (folder, packages, what it holds) of each row."""
    rows = []
    for line in (ROOT / "docs" / "layout.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[\w-]+/`", cells[0]):
            rows.append((cells[0].strip("`/"), re.findall(r"`(bergstream[\w.]*)`", cells[1]), cells[2]))
    return rows


def test_the_layout_page_names_packages_files_and_folders_that_exist() -> None:
    """Each folder docs/layout.md lists is there, with the packages it says, and every file (`name.py`) or
    folder (`name/`) it names in a folder's row is in that folder: a module moved or renamed shows here."""
    rows = _layout_rows()
    assert {"core", "router", "backfill", "runtime", "cli"} <= {folder for folder, _, _ in rows}, rows
    wrong = []
    for folder, packages, holds in rows:
        part = ROOT / folder
        if not part.is_dir():
            wrong.append(f"{folder}/ is not a folder")
            continue
        for package in packages:
            if not (part / "src" / package.replace(".", "/")).is_dir():
                wrong.append(f"{folder}/: no package {package}")
        names = {name for name in re.findall(r"`([\w*./-]+)`", holds) if name.endswith((".py", "/"))}
        for name in sorted(names):
            last = name.rstrip("/").split("/")[-1]
            found = part.rglob(last) if "*" not in last else part.rglob(name.split("/")[0])
            if not any(path.is_dir() == name.endswith("/") for path in found if ".venv" not in path.parts):
                wrong.append(f"{folder}/: no {name}")
    assert not wrong, wrong


def test_the_readme_names_the_folders_that_exist() -> None:
    """The folders README's "What is here" names (`router/`) are the repository's own."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## What is here", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([\w-]+)/`", section))
    assert {"router", "backfill"} <= named, named
    assert not [name for name in sorted(named) if not (ROOT / name).is_dir()], named
