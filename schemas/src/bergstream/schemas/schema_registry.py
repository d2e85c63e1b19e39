"""A topic's schemas in a schema registry (Confluent's REST API): settings, and the versions of its subject.

A topic with `schema_registry` in its settings carries values in the wire format (schemas/wire.py). Its
subject (by default `<topic>-value`, Confluent's TopicNameStrategy) holds one version per schema its
producers registered; each version has a global id, the id in the values. The newest version is the
table's schema: registering a compatible new version evolves the table, as editing a schema file does.

Client settings keep the names of Confluent's clients (`url`, `basic.auth.user.info`, `ssl.ca.location`,
...) and go to confluent-kafka's SchemaRegistryClient, which caches what it fetched. The login is a secret:
it is never printed, logged or put in an error.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from bergstream.errors import BergstreamError, ConfigError
from bergstream.schemas.event_schema import Encoding, EventSchema
from bergstream.schemas.json_schema import avro_from_json_schema

log = logging.getLogger(__name__)
SchemaType = Literal["AVRO", "JSON"]
SCHEMA_TYPES: dict[Encoding, SchemaType] = {"avro": "AVRO", "json": "JSON"}
# HTTP status codes and registry error codes that say "no such thing", not "cannot answer now".
_NOT_FOUND = 404
_UNAUTHORIZED = (401, 403)


class RegistryUnavailable(BergstreamError):
    """The schema registry did not answer, or answered that it cannot serve now."""


class RegistryStopped(BergstreamError):
    """Asked to stop while waiting for the schema registry."""


class SchemaRegistrySettings(BaseModel):
    """`schema_registry:` in a topic's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    url: str = Field(pattern=r"^https?://[^\s/]+")
    # The subject of the topic's values; default `<topic>-value`.
    subject: str | None = None
    # `user:password`, sent with HTTP basic authentication.
    basic_auth_user_info: SecretStr | None = Field(default=None, alias="basic.auth.user.info")
    ssl_ca_location: str | None = Field(default=None, alias="ssl.ca.location")
    timeout_seconds: float = Field(default=10.0, gt=0)
    # While the registry does not answer, a batch whose values have ids the router has not resolved yet is
    # held and tried again with backoff; past this many seconds those values go to the dead-letter table,
    # with the reason, and the router goes on.
    give_up_after_seconds: float = Field(default=300.0, ge=0)
    initial_backoff_seconds: float = Field(default=1.0, gt=0)
    max_backoff_seconds: float = Field(default=30.0, gt=0)

    @field_validator("url")
    @classmethod
    def _no_login_in_url(cls, url: str) -> str:
        if "@" in url.split("/", 3)[2]:
            raise ValueError("put the login in basic.auth.user.info, not in the url")
        return url.rstrip("/")

    @field_validator("basic_auth_user_info")
    @classmethod
    def _user_info(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and ":" not in value.get_secret_value():
            raise ValueError("basic.auth.user.info is user:password")
        return value

    def client_config(self) -> dict[str, Any]:
        """Settings for confluent-kafka's SchemaRegistryClient."""
        # The router waits out an outage itself, with its own backoff and bound.
        config: dict[str, Any] = {"url": self.url, "timeout": self.timeout_seconds, "max.retries": 0}
        if self.basic_auth_user_info is not None:
            config["basic.auth.user.info"] = self.basic_auth_user_info.get_secret_value()
        if self.ssl_ca_location is not None:
            config["ssl.ca.location"] = self.ssl_ca_location
        return config

    def subject_of(self, topic: str) -> str:
        return self.subject or f"{topic}-value"


def client(settings: SchemaRegistrySettings) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(settings.client_config())


@dataclass(frozen=True)
class WriterSchema:
    """One registered schema: its global id, its version in the subject, its type and text."""

    id: int
    version: int
    schema_type: SchemaType
    text: str

    def avro_text(self, name: str) -> str:
        """`avro(name)` as JSON text, written as EventSchema.avro_json writes it."""
        return json.dumps(self.avro(name))

    def avro(self, name: str) -> dict[str, Any]:
        """The schema as an Avro record: itself, or what a JSON Schema describes."""
        parsed = json.loads(self.text)
        if self.schema_type == "JSON":
            return avro_from_json_schema(parsed, name)
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            raise ConfigError(f"schema id {self.id} is not an Avro record")
        return parsed


def call(settings: SchemaRegistrySettings, what: str, request: Any) -> Any:
    """`request()`, with the registry's failures as errors that say which: not found (None), unavailable
    (RegistryUnavailable) or refused (ConfigError)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return request()
    except SchemaRegistryError as error:
        status = error.http_status_code
        if status == _NOT_FOUND:
            return None
        if status in _UNAUTHORIZED:
            raise ConfigError(
                f"the schema registry at {settings.url} refused {what} (HTTP {status}): check "
                "basic.auth.user.info in the topic's schema_registry settings"
            ) from None
        if status is not None and 400 <= status < 500:
            message = error.error_message
            raise ConfigError(f"the schema registry at {settings.url} refused {what}: {message}") from None
        raise RegistryUnavailable(f"the schema registry at {settings.url} failed {what}: {error}") from None
    except OSError as error:
        raise RegistryUnavailable(f"the schema registry at {settings.url} is unreachable: {error}") from None
    except Exception as error:  # httpx's transport errors: refused, timed out, reset
        if type(error).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
            raise RegistryUnavailable(
                f"the schema registry at {settings.url} did not answer {what}: {type(error).__name__} {error}"
            ) from None
        raise


@dataclass
class SubjectSchemas:
    """The versions of one subject, fetched once each; `refresh()` looks for new ones."""

    settings: SchemaRegistrySettings
    subject: str
    encoding: Encoding
    by_id: dict[int, WriterSchema] = field(default_factory=dict)
    _versions: dict[int, WriterSchema] = field(default_factory=dict)
    _client: Any = None

    def __post_init__(self) -> None:
        self._client = client(self.settings)

    @property
    def latest(self) -> WriterSchema | None:
        return self._versions[max(self._versions)] if self._versions else None

    def refresh(self) -> bool:
        """Fetch the versions registered since the last call; whether there were any. Raises
        RegistryUnavailable when the registry does not answer."""
        numbers = call(self.settings, f"the versions of subject {self.subject}",
                       lambda: self._client.get_versions(self.subject)) or []  # fmt: skip
        new = [number for number in numbers if number not in self._versions]
        for number in sorted(new):
            registered = call(self.settings, f"version {number} of subject {self.subject}",
                              lambda n=number: self._client.get_version(self.subject, n))  # fmt: skip
            if registered is None:  # deleted in between
                continue
            schema = registered.schema
            kind: SchemaType = "JSON" if schema.schema_type == "JSON" else "AVRO"
            written = WriterSchema(
                int(registered.schema_id), int(registered.version), kind, schema.schema_str
            )
            self._versions[written.version] = written
            if kind != SCHEMA_TYPES[self.encoding]:
                log.warning("subject %s version %d (id %d) is a %s schema; the topic's encoding is %s: its "
                            "values will be dead-lettered", self.subject, written.version, written.id, kind,
                            self.encoding)  # fmt: skip
                continue
            self.by_id[written.id] = written
        return bool(new)

    def event_schema(self, name: str) -> EventSchema:
        """The table's schema: the subject's newest version of the topic's encoding."""
        usable = [schema for schema in self._versions.values() if schema.id in self.by_id]
        if not usable:
            kind = SCHEMA_TYPES[self.encoding]
            raise ConfigError(
                f"subject {self.subject} in the schema registry at {self.settings.url} has no {kind} schema: "
                "register the topic's schema first (`bergstream produce --schema-registry` does)"
            )
        newest = max(usable, key=lambda schema: schema.version)
        source = f"{self.settings.url}/subjects/{self.subject}/versions/{newest.version} (id {newest.id})"
        return EventSchema(name=name, avro=newest.avro(name), source=source)


def register(settings: SchemaRegistrySettings, subject: str, schema_type: SchemaType, text: str) -> int:
    """Register a schema under `subject` (or find it there); its id."""
    from confluent_kafka.schema_registry import Schema

    schema = Schema(text, schema_type)
    what = f"registering a schema under subject {subject}"
    registered = call(settings, what, lambda: client(settings).register_schema(subject, schema))
    if registered is None:
        raise ConfigError(f"the schema registry at {settings.url} has no subject {subject}")
    return int(registered)


def schema_by_id(settings: SchemaRegistrySettings, schema_id: int) -> WriterSchema | None:
    """Any registered schema, by its global id (the version is not known this way: 0)."""
    found = call(settings, f"schema id {schema_id}", lambda: client(settings).get_schema(schema_id))
    if found is None:
        return None
    return WriterSchema(schema_id, 0, "JSON" if found.schema_type == "JSON" else "AVRO", found.schema_str)


class Outage:
    """An outage of the registry as `who` (a topic, an application's source) lives through it: since when,
    and how long to wait before the next attempt (backoff doubling from `initial_backoff_seconds` to
    `max_backoff_seconds`, for at most `give_up_after_seconds` in all)."""

    def __init__(self, settings: SchemaRegistrySettings, stop: threading.Event, who: str) -> None:
        self.settings = settings
        self.who = who
        self._stop = stop
        self.started: float | None = None
        self._attempts = 0

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.time() - self.started

    def wait(self, error: RegistryUnavailable, what: str) -> bool:
        """Wait before the next attempt, logging the `error` and `what` waits; False, without waiting, once
        the outage has lasted `give_up_after_seconds`. Raises RegistryStopped when `stop` is set meanwhile."""
        settings = self.settings
        if self.started is None:
            self.started = time.time()
        elapsed = self.elapsed
        if elapsed >= settings.give_up_after_seconds:
            return False
        delay = min(
            settings.max_backoff_seconds,
            settings.initial_backoff_seconds * 2.0 ** min(self._attempts, 30),
            settings.give_up_after_seconds - elapsed,
        )
        self._attempts += 1
        log.warning("%s: %s (%s, %.0fs into the outage); trying again in %.1fs",
                    self.who, error, what, elapsed, delay)  # fmt: skip
        if self._stop.wait(delay):
            raise RegistryStopped(f"{self.who}: stopped while waiting for the schema registry")
        return True

    def end(self) -> float | None:
        """The registry answers again: how long the outage lasted, None when there was none."""
        lasted = None if self.started is None else self.elapsed
        self.started = None
        self._attempts = 0
        return lasted


def refresh_waiting(schemas: SubjectSchemas, outage: Outage, what: str) -> None:
    """`schemas.refresh()`, waiting out an outage of the registry; an error naming `outage.who` once it has
    lasted `give_up_after_seconds`."""
    while True:
        try:
            schemas.refresh()
            outage.end()
            return
        except RegistryUnavailable as error:
            if not outage.wait(error, what):
                raise BergstreamError(
                    f"{outage.who}: {error}; gave up after {outage.settings.give_up_after_seconds:.0f}s "
                    "(schema_registry.give_up_after_seconds)"
                ) from None
