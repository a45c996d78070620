"""One beat at a time: a Redis lock (redis-py's `Lock`) that a second beat cannot take.

`beat_init` takes `tuneharness:beat-lock` without blocking, with a 60 s expiry and the beat's
hostname and pid as its token; a daemon thread extends it every 15 s (`Lock.reacquire`, which
checks the token is still ours), and takes it back when it has expired with nobody else holding it
(a beat paused longer than the expiry, by SIGSTOP or a frozen VM, carries on when it resumes). A
second beat finds the key taken and exits with a message naming the holder. If the holder dies,
the key expires within 60 s and the next beat to start takes it; if that happened while this beat
was paused, this beat exits on resume rather than schedule twice.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

LOCK_KEY = "tuneharness:beat-lock"
LOCK_TTL_S = 60
RENEW_EVERY_S = 15


class BeatLock:
    def __init__(self, broker_url: str, *, ttl_s: int = LOCK_TTL_S, renew_every_s: float = RENEW_EVERY_S) -> None:
        import redis

        self.client = redis.Redis.from_url(broker_url)
        self.value = f"{socket.gethostname()}:{os.getpid()}"
        self.ttl_s = ttl_s
        self.renew_every_s = renew_every_s
        # thread_local=False: the renewing thread extends the token the main thread took
        self.lock = self.client.lock(LOCK_KEY, timeout=ttl_s, blocking=False, thread_local=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str | None:
        """Take the lock; return None on success, else the current holder."""
        if self.lock.acquire(blocking=False, token=self.value):
            self._thread = threading.Thread(target=self._renew_loop, name="beat-lock", daemon=True)
            self._thread.start()
            return None
        holder: Any = self.client.get(LOCK_KEY)
        return holder.decode() if isinstance(holder, bytes) else str(holder)

    def renew(self) -> bool:
        """Extend the lock, or take it back if it expired unheld; False when another beat holds it."""
        from redis.exceptions import LockNotOwnedError

        try:
            return bool(self.lock.reacquire())
        except LockNotOwnedError:  # expired: ours again if nobody took it meanwhile
            return bool(self.lock.acquire(blocking=False, token=self.value))

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
            self.lock.release()
        except Exception:  # not ours any more (expired, or taken over): nothing to release
            pass
