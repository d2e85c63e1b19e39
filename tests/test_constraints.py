"""constraints.txt pins every package pyproject.toml names, at a version it accepts; make installs those."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
REFRESH = "run `make lock` and commit constraints.txt"


def pins() -> dict[str, str]:
    """Package name -> pinned version, of the lines whose marker holds on this interpreter."""
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith((" ", "#")):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"constraints.txt: {line!r} is not a pin"
            found[canonicalize_name(requirement.name)] = specifier.version
    return found


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    return [Requirement(text) for text in [*project["dependencies"], *(t for extra in extras for t in extra)]]


def test_every_dependency_is_pinned_at_a_version_pyproject_accepts() -> None:
    pinned = pins()
    missing, refused = [], []
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name not in pinned:
            missing.append(str(requirement))
        elif not requirement.specifier.contains(pinned[name], prereleases=True):
            refused.append(f"{requirement} (pinned {pinned[name]})")
    assert not missing, f"pyproject.toml asks for {missing}, which constraints.txt does not pin: {REFRESH}"
    assert not refused, f"constraints.txt pins versions pyproject.toml refuses: {refused}: {REFRESH}"


def test_the_virtualenv_holds_the_pinned_versions() -> None:
    wrong = []
    for name, pinned in sorted(pins().items()):
        try:
            installed = version(name)
        except PackageNotFoundError:  # an extra make does not install
            continue
        if installed != pinned:
            wrong.append(f"{name} {installed} (pinned {pinned})")
    assert not wrong, f"this virtualenv differs from constraints.txt: {wrong}; run make to reinstall it"
