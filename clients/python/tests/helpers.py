"""Random but valid submissions for parity and consumer tests, and the bridge
that runs the asyncio client under the synchronous client's tests."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import random
import threading
import unicodedata

from oncegate import Submission

# Unicode categories that are unambiguously printable and not whitespace:
# letters, marks, numbers, punctuation, symbols.
_PRINTABLE_CATEGORIES = ("L", "M", "N", "P", "S")


def _printable_pool() -> list[str]:
    pool = []
    # Sample from several planes: ASCII, Latin/Greek/Cyrillic, CJK, emoji, astral.
    ranges = [(0x21, 0x7E), (0xA1, 0x24F), (0x370, 0x4FF), (0x4E00, 0x4FFF),
              (0x1F300, 0x1F64F), (0x10400, 0x1044F)]
    for lo, hi in ranges:
        for cp in range(lo, hi + 1):
            ch = chr(cp)
            if ch == "|" or not ch.isprintable():
                continue
            if unicodedata.category(ch)[0] in _PRINTABLE_CATEGORIES:
                pool.append(ch)
    return pool


PRINTABLE = _printable_pool()
OFFSETS = ["Z", "+00:00", "-00:00", "+05:30", "-08:00", "+14:00", "-12:00", "+09:45"]


def random_award_id(rng: random.Random, max_len: int = 32) -> str:
    """1..max_len printable characters, no '|' (max_len <= 32 keeps it within
    128 characters *and* 128 UTF-8 bytes, whichever the server counts)."""
    return "".join(rng.choice(PRINTABLE) for _ in range(rng.randint(1, max_len)))


def random_timestamp(rng: random.Random) -> str:
    """A valid RFC 3339 timestamp with varied precision and offsets; the key
    uses it verbatim, so variety here is the point."""
    year = rng.randint(1970, 2099)
    month = rng.randint(1, 12)
    day = rng.randint(1, 28)
    ts = f"{year:04d}-{month:02d}-{day:02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
    digits = rng.choice([0, 0, 1, 3, 6, 9])
    if digits:
        ts += "." + "".join(rng.choice("0123456789") for _ in range(digits))
    return ts + rng.choice(OFFSETS)


def random_payload(rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 2, 16, 64, 255, 1024, rng.randint(0, 8192)])
    return rng.randbytes(size)


def random_submission(rng: random.Random, *, award_id: str | None = None) -> Submission:
    return Submission(
        award_id=award_id if award_id is not None else random_award_id(rng),
        submission_timestamp=random_timestamp(rng),
        payload=random_payload(rng),
        amount_cents=rng.randint(1, 10_000_000_00),
    )


class EventLoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="aio-test-loop", daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float | None = None):
        """Run a coroutine on the loop and wait for it: its result, or its exception."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class BlockingAioGate:
    """`oncegate.aio.Gate` behind the synchronous client's interface.

    Each method call runs the asyncio client's coroutine to completion on the
    loop thread and hands back exactly what it returned or raised, so a test
    written for `oncegate.Gate` checks the asyncio client unchanged. The
    client is created, entered (`async with`) and closed on that loop.
    """

    def __init__(self, loop: EventLoopThread, *args, **kwargs) -> None:
        from oncegate.aio import Gate

        async def make():
            return Gate(*args, **kwargs)

        self._loop = loop
        self.aio = loop.run(make())

    def __getattr__(self, name: str):
        attr = getattr(self.aio, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            return self._loop.run(attr(*args, **kwargs))

        return call

    @contextlib.contextmanager
    def effect(self, *args, **kwargs):
        """``async with aio.effect(...)`` driven on the loop thread, as a
        ``with`` block here: the block itself runs in the caller's thread."""
        manager = self.aio.effect(*args, **kwargs)
        fx = self._loop.run(manager.__aenter__())
        try:
            yield fx
        except BaseException as exc:
            if not self._loop.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._loop.run(manager.__aexit__(None, None, None))

    def __enter__(self) -> BlockingAioGate:
        assert self._loop.run(self.aio.__aenter__()) is self.aio
        return self

    def __exit__(self, *exc_info) -> None:
        self._loop.run(self.aio.__aexit__(*exc_info))

    def __repr__(self) -> str:
        return f"BlockingAioGate({self.aio!r})"
