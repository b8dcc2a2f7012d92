"""Login throttling: after a few failed logins in a row, each further attempt for that account, or
from that client address, waits longer — 1 s, then 2, 4, … up to 64 s — and is refused with a
sentence that says when to try again.

| variable              | default | meaning                                                           |
|-----------------------|---------|-------------------------------------------------------------------|
| ``LIAR_LOGIN_DELAY``  | ``1``   | seconds of the first wait; each failure after it doubles the wait |
|                       |         | (at most 64 times this); ``0`` turns throttling off              |

Each attempt is counted as a failure when it is let through, before its password is checked, so
that attempts sent in parallel cannot all slip through one free slot; a success clears the account
and the address. An attempt refused during a wait checks no password and does not count. Failures
are forgotten after :data:`FORGET` seconds without one. Names that are no account are throttled as
accounts are (the answers do not tell which names exist).

The state lives in the web process's memory, behind a lock: every thread of the process (every
request) shares it. It is not kept in the job database: Gradio keeps its logins (the cookies' tokens)
in the same process's memory, so an app run as several processes needs sticky sessions anyway, and
each process then throttles its own share of attempts.

The throttle knows no web framework: ``app.web.gate`` applies it to the login route. The clock is
injectable, so the delays can be checked without waiting for them.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

FREE = 5  # failures in a row before the first wait
DOUBLINGS = 6  # the longest wait is the first one times 2**6
FORGET = 15 * 60.0  # seconds without a failure after which an account's or an address's are forgotten
MAX_KEYS = 10_000  # accounts and addresses remembered at most (the oldest are dropped first)


def delay_after(failures: int, base: float) -> float:
    """Seconds an attempt waits after ``failures`` failures in a row: none for the first
    :data:`FREE`, then ``base``, doubling with each failure, at most ``base * 2**DOUBLINGS``."""
    if failures < FREE or base <= 0:
        return 0.0
    return base * 2 ** min(failures - FREE, DOUBLINGS)


def base_from_env(env: dict[str, str] | None = None) -> float:
    """``LIAR_LOGIN_DELAY`` in seconds (``ValueError``, one sentence, for a value that is not one)."""
    text = (os.environ if env is None else env).get("LIAR_LOGIN_DELAY", "").strip() or "1"
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"LIAR_LOGIN_DELAY is {text!r}: give the first wait in seconds, such as 1") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"LIAR_LOGIN_DELAY is {text!r}: give the first wait in seconds, such as 1")
    return seconds


def refusal(seconds: float) -> str:
    """The sentence a throttled attempt is refused with."""
    return f"too many failed logins for this account or from this address: try again in {math.ceil(seconds)} s"


@dataclass
class _Record:
    failures: int = 0
    last: float = 0.0  # the clock when the last failure was counted


@dataclass
class Throttle:
    """Failed logins per account and per client address (:func:`delay_after` sets the waits)."""

    base: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _records: dict[tuple[str, str], _Record] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Throttle:
        return cls(base=base_from_env(env))

    def _keys(self, user: str, address: str | None) -> list[tuple[str, str]]:
        return [("account", user), ("address", address or "unknown")]

    def _current(self, key: tuple[str, str], now: float) -> _Record:
        record = self._records.get(key)
        if record is None or now - record.last > FORGET:
            return _Record()
        return record

    def wait(self, user: str, address: str | None) -> float:
        """Seconds before an attempt for ``user`` from ``address`` may be checked (0: now)."""
        with self._lock:
            return self._wait(user, address, self.clock())

    def _wait(self, user: str, address: str | None, now: float) -> float:
        waits = []
        for key in self._keys(user, address):
            record = self._current(key, now)
            waits.append(record.last + delay_after(record.failures, self.base) - now)
        return max(0.0, *waits)

    def attempt(self, user: str, address: str | None) -> float:
        """An attempt: 0 when it may be checked now (then it counts as a failure until
        :meth:`succeeded` says otherwise), else the seconds to wait (nothing counted)."""
        with self._lock:
            now = self.clock()
            wait = self._wait(user, address, now)
            if wait > 0:
                return wait
            for key in self._keys(user, address):
                record = self._current(key, now)
                self._records[key] = _Record(record.failures + 1, now)
            self._forget(now)
            return 0.0

    def succeeded(self, user: str, address: str | None) -> None:
        """The attempt's password was right: the account and the address start afresh."""
        with self._lock:
            for key in self._keys(user, address):
                self._records.pop(key, None)

    def failures(self, user: str, address: str | None = None) -> int:
        """Failures in a row counted for the account (or, given, the larger of it and the address's)."""
        with self._lock:
            now = self.clock()
            keys = self._keys(user, address) if address is not None else self._keys(user, None)[:1]
            return max(self._current(key, now).failures for key in keys)

    def _forget(self, now: float) -> None:
        """Records older than :data:`FORGET` dropped, and the oldest beyond :data:`MAX_KEYS`."""
        if len(self._records) <= MAX_KEYS:
            return
        for key in [k for k, r in self._records.items() if now - r.last > FORGET]:
            del self._records[key]
        for key in sorted(self._records, key=lambda k: self._records[k].last)[: len(self._records) - MAX_KEYS]:
            del self._records[key]
