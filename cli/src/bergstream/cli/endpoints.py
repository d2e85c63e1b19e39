"""Where every command finds Kafka, the catalog, the checkpoint root and the schema registry.

The site settings when BERGSTREAM_SITE names them; else the local stack in --data-dir ($BERGSTREAM_HOME, else
./.bergstream). Either is weaker than a topic's or an application's own file and than the flags.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bergstream.catalog import CatalogConfig
from bergstream.errors import ConfigError, StackError
from bergstream.home import default_data_dir
from bergstream.kafka_settings import librdkafka_settings, read_properties
from bergstream.local import LocalStack
from bergstream.schemas.schema_registry import SchemaRegistrySettings
from bergstream.site import ENVIRONMENT as SITE_ENVIRONMENT
from bergstream.site import app_defaults, read_site, router_defaults, site_catalog, site_file

# What the site settings or the local stack give every topic and application: a settings file's error naming
# one of them, with neither there, comes of running before the stack is up.
ENDPOINT_KEYS = ("kafka", "catalog", "checkpoint_location")


@dataclass(frozen=True)
class Endpoints:
    data_dir: Path
    site: Path | None

    @classmethod
    def resolve(cls, data_dir: Path | None) -> Endpoints:
        return cls(data_dir.absolute() if data_dir is not None else default_data_dir(), site_file())

    @classmethod
    def local_stack(cls, data_dir: Path | None) -> Endpoints:
        """The local stack's alone, whatever BERGSTREAM_SITE names: for the commands that run the stack."""
        return cls(data_dir.absolute() if data_dir is not None else default_data_dir(), None)

    @property
    def stack(self) -> LocalStack:
        """The local stack last started in the data dir, running or not."""
        return LocalStack.at(self.data_dir)

    def running_stack(self) -> LocalStack:
        stack = self.stack
        if not stack.status().running:
            raise StackError(
                f"no local stack runs in {stack.config.data_dir}: start it with `bergstream local up` "
                "or name a broker with --bootstrap-servers"
            )
        return stack

    def none_found(self) -> str | None:
        """What to do when there is nothing to run over (no site settings named, no local stack running);
        None when there is."""
        if self.site is not None or self.stack.status().running:
            return None
        up = "bergstream local up"
        if self.data_dir != default_data_dir():
            up += f" --data-dir {self.data_dir}"
        return (
            f"no site settings and no local stack found ({SITE_ENVIRONMENT} is not set; no stack runs in "
            f"{self.data_dir}): start the stack with `{up}`, or set {SITE_ENVIRONMENT} to your site's "
            "settings file"
        )

    @contextmanager
    def explained(self) -> Iterator[None]:
        """A settings error that comes of running before the stack is up (Kafka, the catalog or the checkpoint
        missing, with no site settings and no stack to give them) said so first, with the command that
        mends it."""
        try:
            yield
        except ConfigError as error:
            if not any(key in str(error) for key in ENDPOINT_KEYS) or (found := self.none_found()) is None:
                raise
            raise ConfigError(f"{found}. Without them: {error}") from error

    def router_defaults(self, topic: str) -> dict[str, Any]:
        """A topic's router: Kafka (on a secured local stack, logged in as the topic's own user), the
        catalog, and its checkpoint under the root."""
        if self.site is not None:
            return router_defaults(self.site, topic)
        stack = self.stack
        status = stack.status()
        if not status.running:
            return {}
        login = {f"kafka.{key}": value for key, value in stack.router_client(topic).items()}
        return {
            "kafka": {"kafka.bootstrap.servers": status.bootstrap_servers, **login},
            "catalog": stack.config.catalog.model_dump(mode="json", exclude_none=True),
            "checkpoint_location": str(stack.config.data_dir / "checkpoints" / topic),
        }

    def app_defaults(self, app: str) -> dict[str, Any]:
        """An application: Kafka, the catalog, and its checkpoint under the root."""
        if self.site is not None:
            return app_defaults(self.site, app)
        stack = self.stack
        defaults: dict[str, Any] = {"checkpoint_location": str(stack.config.data_dir / "apps" / app)}
        status = stack.status()
        if status.running:
            defaults["kafka"] = {"kafka.bootstrap.servers": status.bootstrap_servers}
            defaults["catalog"] = stack.config.catalog.model_dump(mode="json", exclude_none=True)
        return defaults

    def catalog(self, config_file: Path | None) -> CatalogConfig:
        """The catalog of a settings file (an application's or a topic's), else the site's, else the local
        stack's (whose SQLite catalog is read while the stack is stopped too)."""
        from bergstream.runtime.settings import catalog_from_file

        if config_file is not None:
            return catalog_from_file(config_file)
        if self.site is not None and (catalog := site_catalog(self.site)) is not None:
            return catalog
        stack = self.stack
        if not stack.status().running and not stack.config.catalog.uri.startswith("jdbc:sqlite:"):
            raise StackError(f"no local stack in {stack.config.data_dir}: name a settings file with --config")
        return stack.config.catalog

    def kafka_client(self, bootstrap_servers: str | None, client_config: Path | None) -> dict[str, str]:
        """librdkafka settings of bergstream's own clients (produce, replay): those of `client_config` (Java
        client names), else the site's kafka settings, else the local stack's producer; `bootstrap_servers`
        over any of them."""
        if client_config is not None:
            java = read_properties(client_config)
        elif bootstrap_servers is not None:
            java = {}
        elif self.site is not None and "kafka" in (site := read_site(self.site)):
            java = {
                key.removeprefix("kafka."): v for key, v in site["kafka"].items() if key.startswith("kafka.")
            }
        else:
            java = self.running_stack().producer_client()
        if bootstrap_servers is not None:
            java["bootstrap.servers"] = bootstrap_servers
        if "bootstrap.servers" not in java:
            java["bootstrap.servers"] = self.running_stack().config.bootstrap_servers
        try:
            return librdkafka_settings(java)
        except ConfigError as error:
            raise ConfigError(
                f"{client_config}: {error}" if client_config is not None else str(error)
            ) from error

    def schema_registry(self, url: str | None) -> SchemaRegistrySettings | None:
        """A registry's URL, or `local` for the local stack's."""
        if url is None:
            return None
        if url == "local":
            url = self.running_stack().status().schema_registry_url
            if url is None:
                raise StackError("the local stack has no registry; `local up --schema-registry` starts one")
        try:
            return SchemaRegistrySettings(url=url)
        except ValidationError as error:
            raise ConfigError(f"--schema-registry {url!r}: give http://host:port, or `local`") from error
