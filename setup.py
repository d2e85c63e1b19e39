"""bergstream is one installed package, `bergstream`, gathered from one source root per top-level folder.

Each folder of the repository (core, schemas, router, backfill, runtime, apps, deploy, local, cli) holds its
part of the `bergstream` namespace under `<folder>/src/bergstream/`, so that a module's import path is its
file path below that root. setuptools cannot find one namespace in several roots by itself (`packages.find`
with several `where` maps the namespace to one root only), so the mapping is written here, from ROOTS.

A wheel also carries what lives outside the source roots (BuildWithJar): bergstream's Java, built with Maven
into bergstream/jvm/bergstream-spark.jar, and the settings files of the example topics and applications
(deploy/topics, deploy/apps) as bergstream/deploy/topics and bergstream/deploy/apps, which the demo runs. An
editable install carries neither: it builds the Java from the checkout on first use, by the same Maven build,
and reads deploy/ there.
"""

import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py
from setuptools.errors import SetupError

HERE = Path(__file__).resolve().parent
# bergstream's Java is built by bergstream.maven, the build a checkout's first use runs too: it needs nothing
# of bergstream but its errors, both in the ground's source root.
sys.path.insert(0, str(HERE / "core" / "src"))
from bergstream import maven  # noqa: E402
from bergstream.errors import BergstreamError  # noqa: E402

EXAMPLE_SETTINGS = ("topics", "apps")

# The folder of each part of bergstream, and the packages it holds. Only core puts modules directly into
# `bergstream`; every other root holds subpackages.
ROOTS = {
    "core": "bergstream",
    "schemas": "bergstream.schemas",
    "router": "bergstream.router",
    "backfill": "bergstream.backfill",
    "runtime": "bergstream.runtime",
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


def build_project_jar(target: Path) -> None:
    """bergstream-spark.jar, built by parts.xml's modules against the pinned Spark and Iceberg."""
    with tempfile.TemporaryDirectory(prefix="bergstream-jar-") as out:
        try:
            built = maven.package(maven.PARTS, Path(out))
        except BergstreamError as error:
            raise SetupError(f"building bergstream (it needs Maven and a JDK 17): {error}") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


class BuildWithJar(build_py):
    def run(self) -> None:
        if not self.editable_mode:
            # The build folder outlives a build: a module since removed from the sources must not ship.
            shutil.rmtree(Path(self.build_lib) / "bergstream", ignore_errors=True)
        super().run()
        if self.editable_mode:
            return
        build_project_jar(Path(self.build_lib) / "bergstream" / "jvm" / maven.PROJECT_JAR)
        for folder in EXAMPLE_SETTINGS:
            settings = Path(self.build_lib) / "bergstream" / "deploy" / folder
            settings.mkdir(parents=True, exist_ok=True)
            for path in (HERE / "deploy" / folder).glob("*.yaml"):
                shutil.copyfile(path, settings / path.name)


packages, package_dir = layout()
setup(packages=packages, package_dir=package_dir, cmdclass={"build_py": BuildWithJar})
