"""A query's own settings (`DriverSettings`): what it subscribes to, its Kafka connection and source
options, trigger, rate limit, checkpoint, Spark session and metrics. Every topic's own settings
(`TopicSettings`: its schema, table, maintenance) are its worker's (router/topic), inside the query's in
the topic's `RouterConfig`.

Where they come from:
- `router run --topic T`: from T's file, the query named T and checkpointed where T's file says, as a
  topic's router always was;
- several `--topic`, `--group G` and `--all`: from the topics' files; topics whose files agree on the
  query-level settings (`QUERY_KEYS`) share a query, named after the group (`--group`, `all` for `--all`,
  else from the topics' names), its checkpoint beside the first topic's;
- `--pattern`: from the defaults file (`--defaults`, or the site's `topic_defaults`) over the endpoints;
  each matching topic's own file, where it has one, sets its topic-level settings. A file that sets another
  trigger or rate limit than the defaults puts its topic in a query of its own settings (one per set of
  them, `pattern_queries`), named after the pattern's query and checkpointed beside it; the pattern's query
  reads the other matching topics. Which files do is read at start: a file changed later takes effect at
  the router's next start.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from bergstream.errors import ConfigError
from bergstream.router.commit_policy import COMMIT_BYTES, COMMIT_RECORDS, CommitPolicy
from bergstream.router.config import (
    QuerySettings,
    RouterConfig,
    check_target_lag,
    check_topic_name,
    commit_policy,
    load_router_config,
    topic_file,
)
from bergstream.router.config import topics_dir as topics_dir_of
from bergstream.settings_file import merge, problems, read_mapping, without_none

log = logging.getLogger("bergstream.router.driver")
# The settings of a topic's file that are its query's: topics that differ in one of them run in queries of
# their own (in one driver), by the one rule `query_key`. Under --pattern, the connection and the cluster
# are the pattern's: its topics' files may set the others (PATTERN_QUERY_KEYS).
QUERY_KEYS = ("kafka", "cluster", "trigger_interval", "max_offsets_per_trigger")
PATTERN_QUERY_KEYS = QUERY_KEYS[2:]
# The settings of a topic's file that are the whole query's, whichever of its topics sets them: under
# --pattern the defaults' (a topic's file setting others is warned of).
QUERY_WIDE = ("spark", "metrics_port", "metrics_host", "lag_refresh_seconds", "commit_retry", "deploy")


class DriverSettings(QuerySettings):
    """A query's own settings: what it reads (`topics`, or every topic whose whole name `pattern` matches)
    and how (QuerySettings, as a topic's file declares them; `deploy`: how `bergstream deploy --pattern`
    renders the query's driver)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    pattern: str | None = None
    # Topics the pattern matches that other queries of the driver read (their files set other query-level
    # settings).
    excluded: tuple[str, ...] = ()
    topics: tuple[str, ...] | None = None
    # How many topics of one batch are appended at once; unset, the driver's cores.
    parallel_topics: int | None = Field(default=None, gt=0)
    # The target lag of the topics it dead-letters whole, whose own settings do not load: the defaults
    # file's under --pattern, the first topic's for named topics.
    target_lag: str | None = None

    @field_validator("target_lag", mode="before")
    @classmethod
    def _target_lag(cls, lag: object) -> str | None:
        return check_target_lag(lag)

    @property
    def commit_policy(self) -> CommitPolicy:
        """When the files of a topic it dead-letters whole are committed."""
        return commit_policy(self.target_lag, COMMIT_BYTES, COMMIT_RECORDS)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        check_topic_name(name)  # it names the checkpoint's folder as a topic's name does
        return name

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{pattern!r} is not a regular expression: {error}") from error
        return pattern

    @model_validator(mode="after")
    def _reads_something(self) -> DriverSettings:
        if (self.pattern is None) == (self.topics is None):
            raise ValueError("a query reads either named topics or the topics a pattern matches")
        if self.topics is not None and not self.topics:
            raise ValueError("a query of named topics names at least one")
        return self

    @property
    def regex(self) -> re.Pattern[str]:
        """The whole names the query reads: its pattern, or its topics'."""
        if self.pattern is not None and self.excluded:
            others = "|".join(re.escape(topic) for topic in self.excluded)
            # Java's regular expressions (Kafka's subscription) read this as Python's do.
            return re.compile(f"(?!(?:{others})$)(?:{self.pattern})")
        if self.pattern is not None:
            return re.compile(self.pattern)
        return re.compile("|".join(re.escape(topic) for topic in self.topics or ()))

    @property
    def subscription(self) -> str:
        """What the query describes itself by in its logs."""
        if self.pattern is not None:
            others = f" but {', '.join(self.excluded)}" if self.excluded else ""
            return f"the topics matching {self.pattern!r}{others}"
        topics = self.topics or ()
        return f"topic {topics[0]}" if len(topics) == 1 else f"{len(topics)} topics ({', '.join(topics)})"

    def source_options(self, every_topic_exists: bool) -> tuple[str, str]:
        """Spark's Kafka source option that says what the query reads, and its value. Named topics that
        all exist are subscribed to by name; otherwise (`--all`, whose topics may be created later) by the
        pattern of their names, which Spark reads a topic of once it exists, where a subscription by name
        fails the query while a topic is missing."""
        if self.pattern is None and every_topic_exists:
            return "subscribe", ",".join(self.topics or ())
        return "subscribePattern", self.regex.pattern


def query_key(settings: QuerySettings, keys: tuple[str, ...] = QUERY_KEYS) -> str:
    """The query-level settings (`keys`) of a topic's or a query's settings, as text: topics with the same
    share a query."""
    # The text names the queries of named topics (and their checkpoints): it stays as it was.
    connection = tuple(sorted(settings.kafka.items())) if "kafka" in keys else ()
    return repr(connection + tuple(repr(getattr(settings, key)) for key in keys if key != "kafka"))


def group_name(topics: list[str], group: str | None) -> str:
    """The name of a query of several named topics (and of its checkpoint): the group's, else one made
    from the topics' names."""
    if group is not None:
        return group
    if len(topics) == 1:
        return topics[0]
    return f"topics-{hashlib.sha256(','.join(sorted(topics)).encode()).hexdigest()[:10]}"


def named_topics_settings(
    name: str, topics: list[RouterConfig], metrics_port: int | None, checkpoint: str | None = None
) -> DriverSettings:
    """The settings of one query of `topics` (their query-level settings all the same) named `name`: one
    topic's query checkpoints where its file says; several topics' at `checkpoint`, else beside the first
    one's checkpoint."""
    first = topics[0]
    if checkpoint is None:
        checkpoint = first.query.checkpoint_location
        if len(topics) > 1 or name != first.settings.topic:
            checkpoint = sibling(first.query.checkpoint_location, name)
    query = first.query.query_settings()
    query["checkpoint_location"] = checkpoint
    if metrics_port is not None:
        query["metrics_port"] = metrics_port
    return DriverSettings(
        name=name,
        topics=tuple(config.settings.topic for config in topics),
        target_lag=first.settings.target_lag,
        **query,
    )


def sibling(location: str, name: str) -> str:
    """The folder `name` beside `location` (a path or a URI)."""
    if "://" in location:
        scheme, rest = location.split("://", 1)
        return f"{scheme}://{PurePosixPath(rest.rstrip('/')).parent / name}"
    return str(Path(location.rstrip("/")).parent / name)


def pattern_name(pattern: str) -> str:
    """The name of a pattern's router when none is given: its Spark query, checkpoint and own group."""
    return f"pattern-{hashlib.sha256(pattern.encode()).hexdigest()[:10]}"


def pattern_defaults(defaults_file: Path | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """The defaults file over `defaults` (the endpoints): every topic's settings and the query's."""
    from_file: dict[str, Any] = {}
    if defaults_file is not None:
        if not defaults_file.is_file():
            raise ConfigError(f"--defaults {defaults_file}: no such file")
        from_file = read_mapping(defaults_file)
        if "topic" in from_file:
            raise ConfigError(
                f"{defaults_file}: names topic {from_file['topic']!r}, but the defaults are every topic's; "
                "leave `topic` out"
            )
    if "catalog" in from_file:
        defaults = {key: value for key, value in defaults.items() if key != "catalog"}
    return merge(defaults, from_file)


def load_pattern_settings(
    pattern: str,
    name: str,
    defaults_file: Path | None,
    defaults: dict[str, Any],
    overrides: dict[str, Any],
) -> DriverSettings:
    """A pattern's query settings: `defaults` (the endpoints), the defaults file, `overrides` (the flags)."""
    merged = merge(pattern_defaults(defaults_file, defaults), without_none(overrides))
    merged.update(name=name, pattern=pattern)
    merged.pop("topics", None)
    where = defaults_file if defaults_file is not None else f"the router of {pattern!r}"
    try:
        return DriverSettings.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(f"{where}: {problems(error)}") from error


def topic_settings(
    topic: str,
    defaults_file: Path | None,
    topics_dir: Path | None,
    endpoints: Callable[[str], dict[str, Any]],
    overrides: dict[str, Any],
) -> RouterConfig:
    """A topic's settings: its own file (<topics dir>/<topic>.yaml) over `defaults_file` over
    `endpoints(topic)`, or the defaults file alone where it has no file of its own; `overrides` over all."""
    own = topic_file(topic, topics_dir)
    if not own.is_file() and defaults_file is None:
        raise ConfigError(
            f"topic {topic}: no settings file {own}, and no defaults for topics without one "
            "(--defaults, or the site's topic_defaults)"
        )
    under = endpoints(topic)
    if own.is_file() and defaults_file is not None:
        from_defaults = read_mapping(defaults_file)
        if "catalog" in from_defaults:
            under = {key: value for key, value in under.items() if key != "catalog"}
        under = merge(under, from_defaults)
    path = own if own.is_file() else defaults_file
    assert path is not None
    return load_router_config(topic, path, under, overrides)


def pattern_topic_settings(
    config: DriverSettings,
    defaults_file: Path | None,
    topics_dir: Path | None,
    endpoints: Callable[[str], dict[str, Any]],
    overrides: dict[str, Any],
    queries: list[DriverSettings] | None = None,
) -> Callable[[str], RouterConfig]:
    """Reads a matching topic's settings: its own file over `defaults_file` over `endpoints(topic)`, or the
    defaults file alone, in the query of `queries` that reads the topic (the pattern's when none names it):
    the topic runs with that query's settings. Without `queries`, its query-level settings are its file's
    (the cluster the pattern's), to find which queries there are (`pattern_queries`)."""
    # Each warning is given once a topic: of query-level settings its query does not run with yet, and of
    # the query's own settings its file sets.
    warned: set[str] = set()
    warned_shared: set[str] = set()
    owner = {topic: query for query in queries or () for topic in query.topics or ()}

    def load(topic: str) -> RouterConfig:
        query = owner.get(topic, config)
        forced = {"checkpoint_location": query.checkpoint_location, "cluster": config.cluster}
        settings = topic_settings(topic, defaults_file, topics_dir, endpoints, {**overrides, **forced})
        own = topic_file(topic, topics_dir)
        path = own if own.is_file() else defaults_file
        if settings.query.catalog != config.catalog:
            raise ConfigError(
                f"topic {topic}: {path} names another catalog than the router of {config.pattern!r}; the "
                "topics of one query share their catalog"
            )
        if queries is None:
            return settings
        ignored = [key for key in PATTERN_QUERY_KEYS if getattr(settings.query, key) != getattr(query, key)]
        if ignored and topic not in warned:
            warned.add(topic)
            log.warning(
                "topic %s: %s sets %s, which the query of %r takes from its defaults until the router's next "
                "start puts the topic in a query of its own", topic, path, " and ".join(ignored),
                config.pattern,
            )  # fmt: skip
        set_here = read_mapping(own).keys() if own.is_file() and topic not in warned_shared else ()
        shared = [
            key
            for key in QUERY_WIDE
            if key in set_here and getattr(settings.query, key) != getattr(query, key)
        ]
        if shared:
            warned_shared.add(topic)
            log.warning(
                "topic %s: %s sets %s, which are its query's settings: the query %s runs with those of "
                "its defaults; set them there", topic, own, " and ".join(shared), query.name,
            )  # fmt: skip
        return settings.in_query(query)

    return load


def pattern_queries(
    config: DriverSettings, topics_dir: Path | None, load: Callable[[str], RouterConfig]
) -> list[DriverSettings]:
    """The queries of a pattern's router: one per set of query-level settings (PATTERN_QUERY_KEYS) that the
    matching topics' own files in `topics_dir` set other than the defaults, named after the pattern's query
    (its name and a digest of the settings) and checkpointed beside it; then the pattern's, reading every
    other matching topic, those created later too. `load` reads a topic's settings; a file that does not
    load leaves its topic to the pattern's query, which dead-letters it whole with why."""
    own: dict[tuple[Any, ...], list[str]] = {}
    for path in sorted(topics_dir_of(topics_dir).glob("*.yaml")):
        topic = path.stem
        if not re.fullmatch(config.pattern or "", topic):
            continue
        try:
            settings = load(topic)
        except ConfigError:
            continue
        if query_key(settings.query, PATTERN_QUERY_KEYS) != query_key(config, PATTERN_QUERY_KEYS):
            own.setdefault(tuple(getattr(settings.query, key) for key in PATTERN_QUERY_KEYS), []).append(
                topic
            )
    queries = []
    for values, topics in own.items():
        digest = hashlib.sha256(repr(values).encode()).hexdigest()[:8]
        name = f"{config.name}-{digest}"
        own_settings = dict(zip(PATTERN_QUERY_KEYS, values, strict=True))
        log.info(
            "%s run in a query of their own (%s): their files set %s", ", ".join(topics), name,
            ", ".join(f"{key} {value}" for key, value in own_settings.items()),
        )  # fmt: skip
        queries.append(
            config.model_copy(
                update={"name": name, "pattern": None, "topics": tuple(topics),
                        "checkpoint_location": sibling(config.checkpoint_location, name), **own_settings}
            )
        )  # fmt: skip
    excluded = tuple(topic for query in queries for topic in query.topics or ())
    return [*queries, config.model_copy(update={"excluded": excluded})]
