"""What the embedded local stack is made of and where it listens (`StackConfig`: its folder, ports, brokers,
catalog, object store, registry and security), and what `bergstream local status` reports of it
(`StackStatus`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError
from bergstream.local import kafka_broker, kafka_security, rest_catalog, schema_registry
from bergstream.local import object_store as store_server

DEFAULT_HOST = "127.0.0.1"
DEFAULT_KAFKA_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
LOOPBACK = ("127.0.0.1", "::1")
# none: plain text, anyone may do anything. sasl_ssl: TLS, SCRAM-SHA-512 logins, ACLs (kafka_security.py).
Security = Literal["none", "sasl_ssl"]
# Where table files go: none, the stack's warehouse folder; s3, a bucket of an S3 object store (versitygw).
ObjectStore = Literal["none", "s3"]
# The Iceberg catalog: jdbc, on a SQLite file; rest, Iceberg's REST catalog server over its own SQLite file.
CatalogKind = Literal["jdbc", "rest"]


@dataclass(frozen=True)
class StackConfig:
    data_dir: Path
    host: str = DEFAULT_HOST
    kafka_port: int = DEFAULT_KAFKA_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    security: Security = "none"
    brokers: int = 1
    # (kafka port, controller port) of the nodes after the first; by default two up from the previous node's.
    other_ports: tuple[tuple[int, int], ...] = ()
    object_store: ObjectStore = "none"
    catalog_kind: CatalogKind = "jdbc"
    object_store_port: int = store_server.DEFAULT_PORT
    rest_port: int = rest_catalog.DEFAULT_PORT
    # A schema registry (Confluent's REST API) on this port; None: the stack runs none.
    schema_registry_port: int | None = None
    # The brokers' group.initial.rebalance.delay.ms (kafka_broker.BrokerConfig).
    group_initial_rebalance_delay_ms: int = 0

    def __post_init__(self) -> None:
        # The catalog's warehouse is a file URI: a stack's folder is always absolute.
        object.__setattr__(self, "data_dir", Path(self.data_dir).resolve())
        if self.host not in LOOPBACK:
            raise ConfigError(
                f"host {self.host!r}: the local stack listens on loopback only (127.0.0.1 or ::1)"
            )
        if self.brokers not in (1, 3):
            raise ConfigError(f"--brokers {self.brokers}: the local stack runs 1 broker, or a cluster of 3")
        object.__setattr__(self, "other_ports", tuple(tuple(pair) for pair in self.other_ports))
        if self.other_ports and len(self.other_ports) != self.brokers - 1:
            raise ConfigError(f"{self.brokers} brokers need {self.brokers - 1} more pairs of ports")
        ports = [port for pair in self.ports for port in pair] + self.service_ports
        for port in ports:
            if not 1 <= port <= 65535:
                raise ConfigError(f"port {port} is not a TCP port (1-65535)")
        if len(set(ports)) != len(ports):
            raise ConfigError(
                f"the stack's ports {ports} repeat a port; pick --kafka-port, --controller-port, "
                "--object-store-port and --rest-port further apart"
            )
        if self.security not in get_args(Security):
            raise ConfigError(f"security {self.security!r}: use one of {', '.join(get_args(Security))}")
        if self.object_store not in get_args(ObjectStore):
            raise ConfigError(
                f"--object-store {self.object_store!r}: use one of {', '.join(get_args(ObjectStore))}"
            )
        if self.catalog_kind not in get_args(CatalogKind):
            kinds = ", ".join(get_args(CatalogKind))
            raise ConfigError(f"--catalog {self.catalog_kind!r}: use one of {kinds}")

    @property
    def service_ports(self) -> list[int]:
        """The ports of the object store and the REST catalog, where the stack runs them."""
        registry = self.schema_registry_port
        return [port for port, used in ((self.object_store_port, self.object_store == "s3"),
                                        (self.rest_port, self.catalog_kind == "rest"),
                                        (registry or 0, registry is not None)) if used]  # fmt: skip

    @property
    def ports(self) -> list[tuple[int, int]]:
        """(kafka port, controller port) of each node."""
        others = self.other_ports or tuple(
            (self.kafka_port + 2 * i, self.controller_port + 2 * i) for i in range(1, self.brokers)
        )
        return [(self.kafka_port, self.controller_port), *others]

    @property
    def nodes(self) -> list[kafka_broker.BrokerConfig]:
        """The Kafka nodes: node 1 in kafka/, the others of a cluster in kafka-2/, kafka-3/."""
        ports = self.ports
        voters = (
            tuple((i + 1, controller) for i, (_, controller) in enumerate(ports)) if len(ports) > 1 else ()
        )
        return [
            kafka_broker.BrokerConfig(
                home=self.data_dir / ("kafka" if i == 0 else f"kafka-{i + 1}"),
                host=self.host,
                port=port,
                controller_port=controller,
                security=self.kafka_security,
                node_id=i + 1,
                voters=voters,
                group_initial_rebalance_delay_ms=self.group_initial_rebalance_delay_ms,
            )
            for i, (port, controller) in enumerate(ports)
        ]

    @property
    def broker(self) -> kafka_broker.BrokerConfig:
        """The first node."""
        return self.nodes[0]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes)

    @property
    def kafka_security(self) -> kafka_security.BrokerSecurity | None:
        if self.security == "none":
            return None
        return kafka_security.BrokerSecurity(self.data_dir / "security")

    @property
    def object_store_config(self) -> store_server.ObjectStoreConfig | None:
        if self.object_store == "none":
            return None
        home = self.data_dir / "object-store"
        return store_server.ObjectStoreConfig(home, self.host, self.object_store_port)

    @property
    def schema_registry_config(self) -> schema_registry.SchemaRegistryConfig | None:
        if self.schema_registry_port is None:
            return None
        return schema_registry.SchemaRegistryConfig(self.data_dir / "schema-registry", self.host,
                                                    self.schema_registry_port)  # fmt: skip

    @property
    def rest_catalog_config(self) -> rest_catalog.RestCatalogConfig | None:
        if self.catalog_kind != "rest":
            return None
        warehouse, properties = self._warehouse()
        return rest_catalog.RestCatalogConfig(
            self.data_dir / "rest-catalog", warehouse, self.host, self.rest_port, properties
        )

    def _warehouse(self) -> tuple[str, dict[str, str]]:
        """Where table files go, and the catalog properties that reach it."""
        store = self.object_store_config
        if store is None:
            return (self.data_dir / "warehouse").as_uri(), {}
        return store.warehouse, store.catalog_properties()

    @property
    def catalog(self) -> CatalogConfig:
        warehouse, properties = self._warehouse()
        rest = self.rest_catalog_config
        if rest is not None:
            return CatalogConfig(type="rest", uri=rest.uri, warehouse=warehouse, properties=properties)
        sqlite = self.data_dir / "catalog" / "catalog.db"
        return CatalogConfig(uri=f"jdbc:sqlite:{sqlite}", warehouse=warehouse, properties=properties)

    @property
    def state_file(self) -> Path:
        return self.data_dir / "stack.json"


@dataclass(frozen=True)
class StackStatus:
    running: bool
    data_dir: str
    bootstrap_servers: str
    broker_pid: int | None
    catalog_name: str
    catalog_uri: str
    catalog_sqlalchemy_uri: str | None  # of a jdbc catalog
    catalog_namespace: str
    warehouse: str
    catalog_type: str = "jdbc"
    rest_catalog_pid: int | None = None
    # With --object-store s3: its endpoint, bucket and server pid, and the file of its keys (never the keys).
    object_store: str = "none"
    object_store_endpoint: str | None = None
    object_store_bucket: str | None = None
    object_store_credentials: str | None = None
    object_store_pid: int | None = None
    # With --schema-registry: where it answers. It keeps schemas in memory: `down` forgets them.
    schema_registry_url: str | None = None
    schema_registry_pid: int | None = None
    security: str = "none"
    broker_pids: list[int | None] | None = None  # of each node of a cluster
    # Secured: the authority's certificate that clients trust, and the client settings (Java client names,
    # passwords included) of the admin and of the producer that `produce` and replay use.
    ca_file: str | None = None
    admin_config: str | None = None
    producer_config: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
