"""bergstream is one installed package, `bergstream`, gathered from one source root per top-level folder.

Each folder of the repository (core, schemas, router, backfill, apps, deploy, local, cli) holds its part of
the `bergstream` namespace under `<folder>/src/bergstream/`, so that a module's import path is its file path
below that root. setuptools cannot find one namespace in several roots by itself (`packages.find` with
several `where` maps the namespace to one root only), so the mapping is written here, from ROOTS.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

# The folder of each part of bergstream, and the packages it holds. Only core puts modules directly into
# `bergstream`; every other root holds subpackages.
ROOTS = {
    "core": "bergstream",
    "schemas": "bergstream.schemas",
    "router": "bergstream.router",
    "backfill": "bergstream.backfill",
    "apps": "bergstream.apps",
    "deploy": "bergstream.deploy",
    "local": ("bergstream.local", "bergstream.loadgen"),
    "cli": "bergstream.cli",
}


def layout() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for folder, tops in ROOTS.items():
        root = Path(folder) / "src"
        for top in (tops,) if isinstance(tops, str) else tops:
            package_dir[top] = (root / top.replace(".", "/")).as_posix()
            subpackages = find_namespace_packages(str(root), include=[f"{top}.*"])
            packages += [top, *subpackages]
    return packages, package_dir


packages, package_dir = layout()
setup(packages=packages, package_dir=package_dir)
