"""docker-compose.yml and the Dockerfile agree with the rest of bergstream: pinned versions, one router per
topic file, Prometheus targets and rules, Grafana provisioning, and site settings every router accepts."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from bergstream.deploy import ALERT_RULES
from bergstream.jars import pinned_versions
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
    assert _image_tag(services["object-store"]) == ("versity/versitygw", VERSITYGW_VERSION)
    # What production runs: Polaris (its admin tool of the same release), Karapace, Prometheus 3.
    assert _image_tag(services["polaris"])[1] == _image_tag(services["polaris-bootstrap"])[1]
    assert _image_tag(services["polaris-bootstrap"])[0] == "apache/polaris-admin-tool"
    assert _image_tag(services["karapace"])[0] == "ghcr.io/aiven-open/karapace"
    prometheus = _image_tag(services["prometheus"])
    assert prometheus[0] == "prom/prometheus" and prometheus[1].startswith("v3.")
    for name, service in services.items():
        image = service["image"]
        pinned_tag = ":" in image and not image.endswith(":latest")
        assert pinned_tag or image == BERGSTREAM_IMAGE, f"{name}: pin the image's version"


def test_the_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    """No `version:` (the Compose Specification dropped it), and what a service waits for says how."""
    assert "version" not in compose
    for name, service in _services(compose).items():
        waits = service.get("depends_on", {})
        assert isinstance(waits, (list, dict)), name
        for needed in waits:
            assert needed in _services(compose), f"{name} depends on {needed}, which is no service"


@pytest.mark.usefixtures("compose_environment")
def test_the_catalog_asks_for_a_login_and_every_client_has_it(compose: dict[str, Any]) -> None:
    """Polaris's root principal (made by its admin tool) is the credential the routers' site settings and
    polaris-setup log in with; the catalog polaris-setup makes is the site's warehouse, in the bucket
    create-bucket makes, on the object store the site names."""
    services = _services(compose)
    bootstrap = " ".join(services["polaris-bootstrap"]["command"])
    principal = re.search(r"--credential=POLARIS,([^,]+),(\S+)", bootstrap)
    assert principal is not None, bootstrap
    credential = f"{principal.group(1)}:{principal.group(2)}"
    router = services["router-playback"]
    assert router["environment"]["POLARIS_CREDENTIAL"] == credential
    assert services["polaris-setup"]["environment"]["POLARIS_CREDENTIAL"] == credential
    catalog = yaml.safe_load(SITE.read_text())["catalog"]  # as written, before the environment fills it in
    assert catalog["properties"]["credential"] == "${POLARIS_CREDENTIAL}"
    assert catalog["properties"]["scope"] == "PRINCIPAL_ROLE:ALL"
    setup = services["polaris-setup"]["command"]
    flags = dict(zip(setup[3::2], setup[4::2], strict=True))
    assert flags["--catalog"] == catalog["warehouse"]
    assert flags["--s3-endpoint"] == catalog["properties"]["s3.endpoint"]
    bucket = re.search(r"create_dir\('([^']+)'\)", services["create-bucket"]["command"][-1])
    assert bucket is not None and flags["--location"].startswith(f"s3://{bucket.group(1)}/")
    assert catalog["uri"].startswith(flags["--uri"])
    # The object store's keys: the same variables for the store, Polaris and the routers.
    keys = services["object-store"]["environment"]["ROOT_ACCESS_KEY_ID"]
    assert (
        router["environment"]["S3_ACCESS_KEY_ID"]
        == keys
        == services["polaris"]["environment"]["AWS_ACCESS_KEY_ID"]
    )
    assert catalog["properties"]["s3.access-key-id"] == "${S3_ACCESS_KEY_ID}"
    assert services["polaris"]["environment"]["QUARKUS_DATASOURCE_JDBC_URL"].startswith(
        "jdbc:postgresql://postgres:"
    )


def test_the_schema_registry_is_karapace_on_the_stacks_kafka(compose: dict[str, Any]) -> None:
    services = _services(compose)
    karapace = services["karapace"]["environment"]
    assert karapace["KARAPACE_KARAPACE_REGISTRY"] == "true"
    assert (
        f"DOCKER://{karapace['KARAPACE_BOOTSTRAP_URI']}"
        in services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    )
    assert (
        f"127.0.0.1:{karapace['KARAPACE_PORT']}:{karapace['KARAPACE_PORT']}" in services["karapace"]["ports"]
    )


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


@pytest.fixture
def compose_environment(monkeypatch: pytest.MonkeyPatch, compose: dict[str, Any]) -> None:
    """The environment the compose file gives bergstream's containers, with its defaults."""
    for name, value in _services(compose)["router-playback"]["environment"].items():
        monkeypatch.setenv(name, re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value)))


@pytest.mark.usefixtures("compose_environment")
def test_site_settings_make_a_valid_router_of_every_topic() -> None:
    site = read_site(SITE)
    for path in TOPICS:
        config = load_router_config(path.stem, path, defaults=router_defaults(SITE, path.stem), overrides={})
        assert config.query.kafka["kafka.bootstrap.servers"] == site["kafka"]["kafka.bootstrap.servers"]
        assert config.query.catalog.type == "rest"
        assert config.query.catalog.warehouse == "archive"
        assert config.query.catalog.properties["credential"] == "bergstream:bergstream-secret"
        assert config.query.checkpoint_location == f"/var/lib/bergstream/checkpoints/{path.stem}"
        assert config.query.spark.master == "spark://spark-master:7077"


@pytest.mark.usefixtures("compose_environment")
def test_service_names_in_site_settings_are_services_with_those_ports(compose: dict[str, Any]) -> None:
    services = _services(compose)
    site = read_site(SITE)
    kafka_host, kafka_port = site["kafka"]["kafka.bootstrap.servers"].split(":")
    assert kafka_host in services
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"DOCKER://{kafka_host}:{kafka_port}" in advertised
    endpoints = [site["catalog"]["uri"], site["catalog"]["properties"]["s3.endpoint"]]
    for endpoint in endpoints:
        address = urllib.parse.urlparse(endpoint)
        host, port = address.hostname, str(address.port)
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


def test_polaris_setup_makes_a_catalog_whose_clients_bring_their_own_keys() -> None:
    from bergstream.deploy.polaris import catalog_request

    made = catalog_request("archive", "s3://archive/warehouse", "http://object-store:7070", "us-east-1")
    storage = made["catalog"]["storageConfigInfo"]
    assert made["catalog"]["properties"]["default-base-location"] == "s3://archive/warehouse"
    assert storage["allowedLocations"] == ["s3://archive/warehouse"]
    assert (storage["storageType"], storage["stsUnavailable"], storage["pathStyleAccess"]) == (
        "S3",
        True,
        True,
    )


def test_polaris_setup_without_a_credential_says_which_variable_to_set() -> None:
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "bergstream.deploy.polaris", "--uri", "http://127.0.0.1:9", "--catalog", "a",
         "--location", "s3://a/w", "--s3-endpoint", "http://127.0.0.1:9"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "set POLARIS_CREDENTIAL=client_id:client_secret" in done.stderr
