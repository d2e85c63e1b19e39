"""docker-compose.yml and the Dockerfile agree with the rest of bergstream: pinned versions, one router per
topic file, Prometheus targets and rules, Grafana provisioning, and site settings every router accepts."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bergstream import jars
from bergstream.deploy import ALERT_RULES
from bergstream.jars import pinned_versions
from bergstream.local import schema_registry
from bergstream.local.object_store import VERSITYGW_VERSION
from bergstream.router.config import load_router_config
from bergstream.site import read_site, router_defaults

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SITE = ROOT / "deploy" / "compose" / "site.yaml"
TOPICS = sorted((ROOT / "deploy" / "topics").glob("*.yaml"))
BERGSTREAM_IMAGE = "${BERGSTREAM_IMAGE:-bergstream:latest}"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def _image_tag(service: dict[str, Any]) -> tuple[str, str]:
    name, _, tag = service["image"].rpartition(":")
    return name, tag


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> file or folder of this repository, for the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = ROOT / source
    return mounts


def _host_path(service: dict[str, Any], container_path: str) -> Path:
    for target, source in _mounts(service).items():
        if container_path == target or container_path.startswith(target + "/"):
            return source / container_path.removeprefix(target).lstrip("/")
    raise AssertionError(f"{container_path} is not mounted from this repository")


def test_images_match_the_versions_bergstream_pins(compose: dict[str, Any]) -> None:
    pinned = pinned_versions()
    services = _services(compose)
    assert _image_tag(services["kafka"]) == ("apache/kafka", pinned.kafka)
    assert _image_tag(services["create-topics"]) == ("apache/kafka", pinned.kafka)
    rest = re.search(r"<iceberg-rest.version>([^<]+)<", jars.POM.read_text())
    assert rest is not None
    assert _image_tag(services["rest-catalog"]) == ("apache/iceberg-rest-fixture", rest.group(1))
    assert _image_tag(services["object-store"]) == ("versity/versitygw", VERSITYGW_VERSION)
    go_mod = (schema_registry.MODULE_DIR / "go.mod").read_text()
    registry = re.search(r"github.com/axonops/axonops-schema-registry v(\S+)", go_mod)
    assert registry is not None
    assert _image_tag(services["schema-registry"]) == (
        "ghcr.io/axonops/axonops-schema-registry",
        registry.group(1),
    )
    for name, service in services.items():
        image = service["image"]
        pinned_tag = ":" in image and not image.endswith(":latest")
        assert pinned_tag or image == BERGSTREAM_IMAGE, f"{name}: pin the image's version"


def test_every_port_is_published_on_loopback_only(compose: dict[str, Any]) -> None:
    for name, service in _services(compose).items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond this machine"


def test_one_router_per_topic_file_with_its_own_settings(compose: dict[str, Any]) -> None:
    services = _services(compose)
    routers = {name: service for name, service in services.items() if name.startswith("router-")}
    assert sorted(routers) == [f"router-{path.stem}" for path in TOPICS]
    creating = " ".join(services["create-topics"]["entrypoint"])
    for path in TOPICS:
        service = routers[f"router-{path.stem}"]
        command = service["command"]
        assert command[:3] == ["bergstream", "router", "run"]
        flags = dict(zip(command[3::2], command[4::2], strict=True))
        assert flags["--topic"] == path.stem
        assert _host_path(service, flags["--config"]) == path
        metrics = int(flags["--metrics-port"])
        assert service["image"] == BERGSTREAM_IMAGE
        assert service["environment"]["BERGSTREAM_SITE"] == "/etc/bergstream/site.yaml"
        assert _host_path(service, "/etc/bergstream/site.yaml") == SITE
        assert re.search(rf"\b{re.escape(path.stem)}\b", creating), f"create-topics misses {path.stem}"
        # Prometheus scrapes it where it serves.
        prometheus = services["prometheus"]
        config = yaml.safe_load(_host_path(prometheus, "/etc/prometheus/prometheus.yml").read_text())
        targets = [t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
        assert f"router-{path.stem}:{metrics}" in targets


def test_site_settings_make_a_valid_router_of_every_topic() -> None:
    site = read_site(SITE)
    for path in TOPICS:
        config = load_router_config(path.stem, path, defaults=router_defaults(SITE, path.stem), overrides={})
        assert config.kafka["kafka.bootstrap.servers"] == site["kafka"]["kafka.bootstrap.servers"]
        assert config.catalog.type == "rest"
        assert config.catalog.warehouse.startswith("s3://")
        assert config.checkpoint_location == f"/var/lib/bergstream/checkpoints/{path.stem}"
        assert config.spark.master == "spark://spark-master:7077"


def test_service_names_in_site_settings_are_services_with_those_ports(compose: dict[str, Any]) -> None:
    services = _services(compose)
    site = read_site(SITE)
    kafka_host, kafka_port = site["kafka"]["kafka.bootstrap.servers"].split(":")
    assert kafka_host in services
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"DOCKER://{kafka_host}:{kafka_port}" in advertised
    endpoints = [site["catalog"]["uri"], site["catalog"]["properties"]["s3.endpoint"]]
    for endpoint in endpoints:
        host, port = endpoint.removeprefix("http://").split(":")
        assert host in services, f"{endpoint}: no service {host}"
        published = [mapping.rsplit(":", 1)[-1] for mapping in services[host].get("ports", [])]
        assert port in published, f"{endpoint}: {host} serves {published}"
    master = site["spark"]["master"].removeprefix("spark://").split(":")[0]
    assert master in services


def test_prometheus_loads_the_rules_of_deploy_prometheus(
    compose: dict[str, Any], tmp_path: Path, promtool: str
) -> None:
    prometheus = _services(compose)["prometheus"]
    config = _host_path(prometheus, "/etc/prometheus/prometheus.yml")
    rules = _host_path(prometheus, "/etc/prometheus/alerts.yml")
    assert rules == ALERT_RULES
    # Checked as the container sees it: both files in one folder.
    shutil.copy(config, tmp_path / "prometheus.yml")
    shutil.copy(rules, tmp_path / "alerts.yml")
    checked = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 rules found" not in checked.stdout and "rules found" in checked.stdout


def test_grafana_provisions_the_prometheus_source_and_the_router_dashboard(compose: dict[str, Any]) -> None:
    grafana = _services(compose)["grafana"]
    provisioning = _host_path(grafana, "/etc/grafana/provisioning")
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert sources[0]["type"] == "prometheus"
    assert (
        sources[0]["url"]
        == f"http://prometheus:{_services(compose)['prometheus']['ports'][0].split(':')[-1]}"
    )
    providers = yaml.safe_load((provisioning / "dashboards" / "bergstream.yml").read_text())["providers"]
    dashboards = _host_path(grafana, providers[0]["options"]["path"])
    assert (dashboards / "bergstream-router.json").is_file()


def test_the_backfill_runs_an_application_file_on_demand(compose: dict[str, Any]) -> None:
    backfill = _services(compose)["backfill"]
    assert backfill["profiles"] == ["backfill"]
    line = shlex.split(backfill["command"][-1])
    assert line[:3] == ["exec", "bergstream", "backfill"] and line[3] == "run"
    default_app = re.search(r"BACKFILL_APP:-(\w+)", backfill["command"][-1])
    assert default_app is not None
    assert _host_path(backfill, f"/etc/bergstream/apps/{default_app.group(1)}.yaml").is_file()


def test_dockerfile_installs_what_make_installs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "bergstream jars resolve" in dockerfile, "the image must hold the pinned jars"
    assert "['optional-dependencies']['postgres']" in dockerfile, "the image needs the PostgreSQL driver"
    assert re.search(r"openjdk-17-j(re|dk)-headless", dockerfile)
    assert "USER bergstream" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv*" in ignored and ".git" in ignored


def test_compose_file_is_valid_for_compose_itself() -> None:
    compose_cli = shutil.which("docker-compose")
    if compose_cli is None:
        pytest.fail("docker-compose is missing: deploy/install-system-packages.sh installs it")
    checked = subprocess.run(
        [compose_cli, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True, cwd=ROOT
    )
    assert checked.returncode == 0, checked.stderr
