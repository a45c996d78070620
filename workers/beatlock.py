"""One beat at a time: a Redis lock that a second beat cannot take.

`beat_init` takes `tuneharness:beat-lock` with SET NX and a 60 s expiry, holding the beat's
hostname and pid; a daemon thread renews it every 15 s while the value is still ours, and takes it
back when it has expired with nobody else holding it (a beat paused longer than the expiry, by
SIGSTOP or a frozen VM, carries on when it resumes), all in one Lua compare-and-set. A second beat
finds the key taken and exits with a message naming the holder. If the holder dies, the key
expires within 60 s and the next beat to start takes it; if that happened while this beat was
paused, this beat exits on resume rather than schedule twice.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

LOCK_KEY = "tuneharness:beat-lock"
LOCK_TTL_S = 60
RENEW_EVERY_S = 15

_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  return redis.call('expire', KEYS[1], ARGV[2])
end
if not holder then
  redis.call('set', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class BeatLock:
    def __init__(self, broker_url: str, *, ttl_s: int = LOCK_TTL_S, renew_every_s: float = RENEW_EVERY_S) -> None:
        import redis

        self.client = redis.Redis.from_url(broker_url)
        self.value = f"{socket.gethostname()}:{os.getpid()}"
        self.ttl_s = ttl_s
        self.renew_every_s = renew_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str | None:
        """Take the lock; return None on success, else the current holder."""
        if self.client.set(LOCK_KEY, self.value, nx=True, ex=self.ttl_s):
            self._thread = threading.Thread(target=self._renew_loop, name="beat-lock", daemon=True)
            self._thread.start()
            return None
        holder: Any = self.client.get(LOCK_KEY)
        return holder.decode() if isinstance(holder, bytes) else str(holder)

    def renew(self) -> bool:
        """Extend the lock, or take it back if it expired unheld; False when another beat holds it."""
        return bool(self.client.eval(_RENEW, 1, LOCK_KEY, self.value, self.ttl_s))

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                if not self.renew():
                    os._exit(3)  # someone else holds it now: never schedule twice
            except Exception:  # a broker blip: the lock lasts ttl_s, try again
                continue

    def release(self) -> None:
        self._stop.set()
        try:
            self.client.eval(_RELEASE, 1, LOCK_KEY, self.value)
        except Exception:
            pass
