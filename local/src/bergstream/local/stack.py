"""`bergstream local up | down | status`: the embedded stack on the loopback interface."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bergstream import jars
from bergstream.errors import StackError
from bergstream.home import write_catalog
from bergstream.local import kafka_broker, kafka_security, processes, rest_catalog, schema_registry
from bergstream.local import object_store as store_server
from bergstream.local.stack_config import (
    StackConfig,
    StackStatus,
)


class LocalStack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config

    @classmethod
    def at(cls, data_dir: Path) -> LocalStack:
        """The stack last started in `data_dir`, with the ports it was started with."""
        state = data_dir / "stack.json"
        if not state.exists():
            return cls(StackConfig(data_dir=data_dir))
        try:
            saved = json.loads(state.read_text())
        except json.JSONDecodeError as error:
            raise StackError(
                f"{state} is not valid JSON ({error}); remove it and run `bergstream local up`"
            ) from error
        return cls(
            StackConfig(
                data_dir=data_dir,
                host=saved["host"],
                kafka_port=saved["kafka_port"],
                controller_port=saved["controller_port"],
                security=saved.get("security", "none"),
                brokers=saved.get("brokers", 1),
                other_ports=saved.get("other_ports", ()),
                object_store=saved.get("object_store", "none"),
                catalog_kind=saved.get("catalog", "jdbc"),
                object_store_port=saved.get("object_store_port", store_server.DEFAULT_PORT),
                rest_port=saved.get("rest_port", rest_catalog.DEFAULT_PORT),
                schema_registry_port=saved.get("schema_registry_port"),
            )
        )

    def up(self) -> StackStatus:
        with processes.locked(self.config.data_dir / "stack.lock"):
            return self._up()

    def _up(self) -> StackStatus:
        config = self.config
        pid = next(filter(None, (kafka_broker.running_pid(node) for node in config.nodes)), None)
        pid = pid or self._service_pid()
        if pid is not None:
            running = LocalStack.at(config.data_dir).status()
            raise StackError(
                f"the local stack in {config.data_dir} is already running (broker pid {pid}, "
                f"{running.bootstrap_servers}); stop it with `bergstream local down`"
            )
        for kafka_port, controller_port in config.ports:
            for name, port in (("--kafka-port", kafka_port), ("--controller-port", controller_port)):
                if processes.port_in_use(config.host, port):
                    raise StackError(
                        f"port {port} on {config.host} is already in use; choose another with {name}"
                    )
        self._refuse_other_layout()
        jars.resolve_all()
        (config.data_dir / "catalog").mkdir(parents=True, exist_ok=True)
        if config.object_store_config is None:
            (config.data_dir / "warehouse").mkdir(parents=True, exist_ok=True)
        self._start_services_and(lambda: kafka_broker.start_cluster(config.nodes))
        config.state_file.write_text(
            json.dumps(
                {
                    "host": config.host,
                    "kafka_port": config.kafka_port,
                    "controller_port": config.controller_port,
                    "security": config.security,
                    "brokers": config.brokers,
                    "other_ports": config.other_ports,
                    "object_store": config.object_store,
                    "catalog": config.catalog_kind,
                    "object_store_port": config.object_store_port,
                    "rest_port": config.rest_port,
                    "schema_registry_port": config.schema_registry_port,
                }
            )
        )
        write_catalog(config.data_dir, config.catalog)
        security = config.kafka_security
        if security is not None:
            bootstrap = config.bootstrap_servers
            security.write_client_files(bootstrap)
            if security.password(kafka_security.PRODUCER) is None:
                security.add_user(
                    kafka_security.PRODUCER, bootstrap, kafka_security.producer_acls(kafka_security.PRODUCER)
                )
        return self.status()

    def _start_services_and(self, start_kafka: Callable[[], object]) -> None:
        """Start the object store, the REST catalog, the schema registry, then Kafka; stop what started if
        one fails."""
        store, rest = self.config.object_store_config, self.config.rest_catalog_config
        registry = self.config.schema_registry_config
        try:
            if store is not None:
                store_server.start(store)
            if rest is not None:
                rest_catalog.start(rest)
            if registry is not None:
                schema_registry.start(registry)
            start_kafka()
        except BaseException:
            if registry is not None:
                schema_registry.stop(registry)
            if rest is not None:
                rest_catalog.stop(rest)
            if store is not None:
                store_server.stop(store)
            raise

    def _service_pid(self) -> int | None:
        """The pid of the stack's object store or REST catalog, when one runs."""
        store, rest = self.config.object_store_config, self.config.rest_catalog_config
        registry = self.config.schema_registry_config
        pids = (
            store_server.running_pid(store) if store is not None else None,
            rest_catalog.running_pid(rest) if rest is not None else None,
            schema_registry.running_pid(registry) if registry is not None else None,
        )
        return next(filter(None, pids), None)

    def _refuse_other_layout(self) -> None:
        """A broker's log directory is formatted for its security: plain text, or with the admin's login. A
        catalog's tables keep the warehouse they were made in, and each kind of catalog has its own tables."""
        config = self.config
        if not config.state_file.exists():
            return
        before = LocalStack.at(config.data_dir).config
        formatted = (config.broker.log_dir / "meta.properties").exists()
        for flag, old, new in (
            ("--security", before.security if formatted else config.security, config.security),
            ("--object-store", before.object_store, config.object_store),
            ("--catalog", before.catalog_kind, config.catalog_kind),
        ):
            if old != new:
                raise StackError(
                    f"the local stack in {config.data_dir} was made with {flag} {old}: start it so again, "
                    "or remove the folder for a new stack"
                )

    def router_client(self, topic: str) -> dict[str, str]:
        """The Java client settings of the user of `topic`'s router, made on first use: it may read the
        topic and commit group bergstream-router.<topic>, nothing else. Empty on a stack without security."""
        security = self.config.kafka_security
        if security is None:
            return {}
        user = kafka_security.router_user(topic)
        bootstrap = self.config.bootstrap_servers
        if security.password(user) is None:
            with processes.locked(self.config.data_dir / "stack.lock"):
                if security.password(user) is None:
                    security.add_user(user, bootstrap, kafka_security.router_acls(user, topic))
        return security.client_settings(user, bootstrap)

    def producer_client(self) -> dict[str, str]:
        """The Java client settings that `produce` and replay use: the producer's, when secured."""
        security = self.config.kafka_security
        bootstrap = self.config.bootstrap_servers
        if security is None:
            return {"bootstrap.servers": bootstrap}
        return security.client_settings(kafka_security.PRODUCER, bootstrap)

    def down(self) -> None:
        with processes.locked(self.config.data_dir / "stack.lock"):
            stopped = [kafka_broker.stop(node) for node in self.config.nodes]
            store, rest = self.config.object_store_config, self.config.rest_catalog_config
            if rest is not None:
                stopped.append(rest_catalog.stop(rest))
            if store is not None:
                stopped.append(store_server.stop(store))
            registry = self.config.schema_registry_config
            if registry is not None:
                stopped.append(schema_registry.stop(registry))
            if not any(stopped):
                raise StackError(
                    f"nothing is running in {self.config.data_dir}; `bergstream local up` starts the stack"
                )

    def status(self) -> StackStatus:
        config = self.config
        catalog = config.catalog
        pids = [kafka_broker.running_pid(node) for node in config.nodes]
        return StackStatus(
            running=any(pid is not None for pid in pids),
            data_dir=str(config.data_dir),
            bootstrap_servers=config.bootstrap_servers,
            broker_pid=pids[0],
            broker_pids=pids if config.brokers > 1 else None,
            catalog_name=catalog.name,
            catalog_uri=catalog.uri,
            catalog_sqlalchemy_uri=catalog.sqlalchemy_uri() if catalog.type == "jdbc" else None,
            catalog_namespace=catalog.namespace,
            warehouse=catalog.warehouse,
            **self._security_status(),
            **self._services_status(),
        )

    def _services_status(self) -> dict[str, Any]:
        store, rest = self.config.object_store_config, self.config.rest_catalog_config
        status: dict[str, Any] = {}
        registry = self.config.schema_registry_config
        if registry is not None:
            status.update(
                schema_registry_url=registry.url, schema_registry_pid=schema_registry.running_pid(registry)
            )
        if rest is not None:
            status.update(catalog_type="rest", rest_catalog_pid=rest_catalog.running_pid(rest))
        if store is not None:
            status.update(
                object_store=self.config.object_store,
                object_store_endpoint=store.endpoint,
                object_store_bucket=store.bucket,
                object_store_credentials=str(store.credentials_file),
                object_store_pid=store_server.running_pid(store),
            )
        return status

    def _security_status(self) -> dict[str, Any]:
        security = self.config.kafka_security
        if security is None:
            return {}
        return {
            "security": self.config.security,
            "ca_file": str(security.ca_file),
            "admin_config": str(security.client_file(kafka_security.ADMIN)),
            "producer_config": str(security.client_file(kafka_security.PRODUCER)),
        }
