"""Realistic impression and playback events, deterministic for a seed and a clock.

Both topics derive from one sequence of *views* (a profile of an account shown a title on a device) seeded by
`seed` alone: the impression stream emits every view, the playback stream plays the views that convert (the
take rate) and some titles found without an impression. So the impression and playback streams of two
models with the same seed agree, and an attribution join on (account_id, show_id) finds the impression
behind most plays. Plays of a view start when the playback stream reaches it; with these defaults a
playback event consumes about 0.6 views, so at equal event rates a play trails its impression.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, NamedTuple, TypeVar

TOPICS = ("playback", "impression")

_T = TypeVar("_T")

_TAKE_RATE = 0.07
_UNATTRIBUTED_PLAYS = 0.2  # continue watching, deep links: plays no impression in the stream led to
_ACTIVE_PLAYS = 64
_HEARTBEAT_SEC = 60
_MEAN_HEARTBEATS = 20
_NULL_BITRATE = 0.03
_NULL_ARTWORK = 0.15
# Exponents of the rank-frequency laws; below 1 so that no single account or show takes over the stream.
_ACCOUNT_SKEW = 0.8
_SHOW_SKEW = 0.9

# Multiplying by about the golden ratio of a prime modulus maps popularity ranks 1..n to distinct, scattered
# ids: 8-9 digit account ids, 8 digit show ids.
_ACCOUNT_ID_BASE = 10_000_000
_ACCOUNT_ID_MODULUS = 899_999_963
_ACCOUNT_ID_MULTIPLIER = 556_230_567
_SHOW_ID_BASE = 70_000_000
_SHOW_ID_MODULUS = 19_999_999
_SHOW_ID_MULTIPLIER = 12_360_679
_COUNTRY_MULTIPLIER = 2_654_435_761
MAX_ACCOUNTS = _ACCOUNT_ID_MODULUS - 1
MAX_SHOWS = _SHOW_ID_MODULUS - 1

_MICROSECOND = timedelta(microseconds=1)


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class GeneratedEvent:
    """One record for a topic: `key` is the account id in ASCII, `event` has exactly the schema's fields."""

    key: bytes
    event: dict[str, Any]
    late: bool


class _Weighted(Generic[_T]):
    def __init__(self, weighted: Sequence[tuple[_T, float]]) -> None:
        self._items = [item for item, _ in weighted]
        self._cumulative = list(itertools.accumulate(weight for _, weight in weighted))
        self._total = self._cumulative[-1]
        self._last = len(self._items) - 1

    def pick(self, rng: random.Random) -> _T:
        return self.at(rng.random())

    def at(self, quantile: float) -> _T:
        # hi keeps a quantile rounded up to the total on the last item.
        return self._items[bisect.bisect(self._cumulative, quantile * self._total, 0, self._last)]


class _PowerLaw:
    """Ranks 1..n with frequency falling as rank**-exponent, drawn in O(1) by inverting the continuous law."""

    def __init__(self, n: int, exponent: float) -> None:
        self._n = n
        self._inverse_power = 1.0 / (1.0 - exponent)
        self._span = (n + 1) ** (1.0 - exponent) - 1.0

    def rank(self, rng: random.Random) -> int:
        return min(int((1.0 + rng.random() * self._span) ** self._inverse_power), self._n)


class _Device(NamedTuple):
    type: str
    os: str
    app_version: str
    top_rung: int  # the highest bitrate the device streams, as an index into _BITRATE_LADDER


_BITRATE_LADDER = (235, 375, 560, 750, 1050, 1750, 2350, 3000, 4300, 5800, 8000, 16000)

_DEVICES = _Weighted(
    [
        (_Device("tv", "tizen", "6.4.12", 11), 16),
        (_Device("tv", "webos", "6.4.12", 11), 10),
        (_Device("tv", "android_tv", "8.112.0", 11), 12),
        (_Device("tv", "roku_os", "12.5.1", 10), 10),
        (_Device("tv", "tvos", "17.4.0", 11), 6),
        (_Device("mobile", "ios", "16.12.0", 6), 9),
        (_Device("mobile", "android", "8.113.1", 6), 11),
        (_Device("web", "windows", "6.0051.102.911", 9), 7),
        (_Device("web", "macos", "6.0051.102.911", 9), 3),
        (_Device("tablet", "ipados", "16.12.0", 8), 5),
        (_Device("tablet", "android", "8.113.1", 8), 3),
        (_Device("console", "playstation", "5.2.0", 10), 5),
        (_Device("console", "xbox", "2.4.7", 10), 3),
    ]
)

_COUNTRIES = _Weighted(
    [
        ("US", 30), ("BR", 9), ("GB", 7), ("MX", 6), ("CA", 5), ("DE", 5), ("FR", 5), ("IN", 4), ("ES", 4),
        ("JP", 4), ("KR", 3), ("AU", 3), ("IT", 3), ("AR", 3), ("NL", 2), ("PL", 2), ("TR", 2), ("SE", 1),
    ]
)  # fmt: skip

_PAGES = _Weighted(
    [
        ("home", 50), ("browse", 14), ("search", 10), ("title_details", 8), ("new_and_popular", 7),
        ("my_list", 6), ("kids", 3), ("games", 2),
    ]
)  # fmt: skip


class _View(NamedTuple):
    key: bytes
    account_id: int
    profile_id: int
    show_id: int
    device: _Device
    country: str


class _Play:
    __slots__ = ("heartbeats_left", "playback_id", "position_sec", "rung", "view", "view_duration_sec")

    def __init__(self, view: _View, rng: random.Random) -> None:
        self.view = view
        self.playback_id = _uuid(rng)
        runtime_sec = _runtime_sec(view.show_id)
        # Most plays resume where the profile stopped before.
        self.position_sec = 0 if rng.random() < 0.4 else int(rng.random() * runtime_sec * 0.9)
        self.view_duration_sec = 0
        remaining = (runtime_sec - self.position_sec) // _HEARTBEAT_SEC
        self.heartbeats_left = min(int(rng.expovariate(1 / _MEAN_HEARTBEATS)), remaining)
        # Adaptive streaming starts in the middle of the ladder and moves one rung at a time.
        self.rung = view.device.top_rung // 2


def _runtime_sec(show_id: int) -> int:
    """From 20-minute episodes to 150-minute films, fixed per show."""
    return 60 * (20 + show_id * 31 % 131)


def _uuid(rng: random.Random) -> str:
    # Formatted by hand: uuid.UUID would take a quarter of the time spent on an impression.
    digits = f"{rng.getrandbits(128):032x}"
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{digits[16:20]}-{digits[20:]}"


class EventModel:
    """Infinite, deterministic event streams per topic; see the module docstring for how topics relate.

    A fraction `late_fraction` of events has `event_ts` earlier than `clock()` by up to `max_lateness`;
    `clock` must return timezone-aware datetimes.
    """

    def __init__(
        self,
        seed: int = 0,
        accounts: int = 1_000_000,
        shows: int = 20_000,
        late_fraction: float = 0.0,
        max_lateness: timedelta = timedelta(minutes=30),
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if not 1 <= accounts <= MAX_ACCOUNTS:
            raise ValueError(f"accounts must be between 1 and {MAX_ACCOUNTS}, got {accounts}")
        if not 1 <= shows <= MAX_SHOWS:
            raise ValueError(f"shows must be between 1 and {MAX_SHOWS}, got {shows}")
        if not 0.0 <= late_fraction <= 1.0:
            raise ValueError(f"late_fraction must be between 0 and 1, got {late_fraction}")
        if max_lateness < _MICROSECOND:
            raise ValueError(f"max_lateness must be positive, got {max_lateness}")
        self._seed = seed
        self._accounts = _PowerLaw(accounts, _ACCOUNT_SKEW)
        self._shows = _PowerLaw(shows, _SHOW_SKEW)
        self._late_fraction = late_fraction
        self._max_lateness_us = max_lateness // _MICROSECOND
        self._clock = clock

    def events(self, topic: str) -> Iterator[GeneratedEvent]:
        if topic == "playback":
            return self._playbacks()
        if topic == "impression":
            return self._impressions()
        raise ValueError(f"unknown topic {topic!r}; known topics: {', '.join(TOPICS)}")

    def _view(self, rng: random.Random) -> _View:
        account_id = (
            _ACCOUNT_ID_BASE + self._accounts.rank(rng) * _ACCOUNT_ID_MULTIPLIER % _ACCOUNT_ID_MODULUS
        )
        profiles = 1 + account_id % 5
        # Squaring favours the first profile, usually the account holder's.
        draw = rng.random()
        profile_id = 1 + int(profiles * draw * draw)
        show_id = _SHOW_ID_BASE + self._shows.rank(rng) * _SHOW_ID_MULTIPLIER % _SHOW_ID_MODULUS
        # An account lives in one country: derive it from the id instead of drawing it.
        country = _COUNTRIES.at(account_id * _COUNTRY_MULTIPLIER % 2**32 / 2**32)
        key = str(account_id).encode("ascii")
        return _View(key, account_id, profile_id, show_id, _DEVICES.pick(rng), country)

    def _views(self) -> Iterator[tuple[_View, bool]]:
        """The views shared by both topics, each with whether it converts into a play."""
        rng = random.Random(f"{self._seed}/views")
        while True:
            yield self._view(rng), rng.random() < _TAKE_RATE

    def _timestamps(self, topic: str) -> Callable[[], tuple[datetime, bool]]:
        # Its own generator, so that the late fraction changes timestamps only.
        rng = random.Random(f"{self._seed}/{topic}/lateness")

        def stamp() -> tuple[datetime, bool]:
            now = self._clock()
            if rng.random() < self._late_fraction:
                return now - timedelta(microseconds=rng.randint(1, self._max_lateness_us)), True
            return now, False

        return stamp

    def _impressions(self) -> Iterator[GeneratedEvent]:
        rng = random.Random(f"{self._seed}/impression")
        stamp = self._timestamps("impression")
        for view, _ in self._views():
            event_ts, late = stamp()
            row_draw, rank_draw = rng.random(), rng.random()
            # Titles without personalised artwork fall back to the default one.
            artwork_id = (
                None if rng.random() < _NULL_ARTWORK else f"{view.show_id}_{rng.randrange(1, 13):02d}"
            )
            event = {
                "impression_id": _uuid(rng),
                "account_id": view.account_id,
                "profile_id": view.profile_id,
                "show_id": view.show_id,
                "page": _PAGES.pick(rng),
                # Squared draws: the top rows and the first titles of a row are seen far more often.
                "row": int(41 * row_draw * row_draw),
                "rank": int(76 * rank_draw * rank_draw),
                "event_ts": event_ts,
                "device": _device_record(view.device),
                "country": view.country,
                "artwork_id": artwork_id,
            }
            yield GeneratedEvent(key=view.key, event=event, late=late)

    def _playbacks(self) -> Iterator[GeneratedEvent]:
        rng = random.Random(f"{self._seed}/playback")
        stamp = self._timestamps("playback")
        converted = (view for view, converts in self._views() if converts)
        active: list[_Play] = []
        while True:
            bitrate: int | None
            # Plays open a few at a time, so that the stream interleaves plays from its start as well.
            if len(active) < _ACTIVE_PLAYS and (not active or rng.random() < 0.5):
                play = _Play(self._view(rng) if rng.random() < _UNATTRIBUTED_PLAYS else next(converted), rng)
                active.append(play)
                event_type = "START"
                bitrate = None  # nothing streamed yet
            else:
                index = int(rng.random() * len(active))
                play = active[index]
                if play.heartbeats_left:
                    play.heartbeats_left -= 1
                    event_type, step = "HEARTBEAT", _HEARTBEAT_SEC
                else:
                    runtime_left = _runtime_sec(play.view.show_id) - play.position_sec
                    event_type, step = "STOP", min(int(rng.random() * _HEARTBEAT_SEC), runtime_left)
                    active[index] = active[-1]
                    active.pop()
                play.position_sec += step
                play.view_duration_sec += step
                play.rung = min(max(play.rung + int(rng.random() * 3) - 1, 0), play.view.device.top_rung)
                bitrate = None if rng.random() < _NULL_BITRATE else _BITRATE_LADDER[play.rung]
            event_ts, late = stamp()
            view = play.view
            event = {
                "playback_id": play.playback_id,
                "account_id": view.account_id,
                "profile_id": view.profile_id,
                "show_id": view.show_id,
                "event_type": event_type,
                "event_ts": event_ts,
                "position_sec": play.position_sec,
                "view_duration_sec": play.view_duration_sec,
                "device": _device_record(view.device),
                "country": view.country,
                "bitrate_kbps": bitrate,
            }
            yield GeneratedEvent(key=view.key, event=event, late=late)


def _device_record(device: _Device) -> dict[str, str]:
    return {"type": device.type, "os": device.os, "app_version": device.app_version}
