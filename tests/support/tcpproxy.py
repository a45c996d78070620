"""A TCP proxy on loopback that a test can cut and restore: a network partition between one process
and a server (a worker and its Redis) without touching either.

`cut()` resets every open connection and refuses new ones (the listener stays bound, so the client
sees "connection refused" or a reset, as behind a failed switch); `restore()` accepts again.
Connections are relayed by two threads each; stdlib only.
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

__all__ = ["TcpProxy"]

_CHUNK = 65536


class TcpProxy:
    """Forward 127.0.0.1:`port` to `target_host`:`target_port` until cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = threading.Event()
        self._closed = threading.Event()
        self.accepted = 0  # connections relayed so far (a reconnect shows as one more)
        self.refused = 0  # connections reset while cut
        self._thread = threading.Thread(target=self._accept_loop, name=f"tcpproxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url_host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Partition: reset every relayed connection now and every new one until `restore`."""
        self._cut.set()
        with self._lock:
            doomed = list(self._open)
            self._open.clear()
        for sock in doomed:
            _reset(sock)

    def restore(self) -> None:
        """Heal the partition: new connections are relayed again."""
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._listener.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                pair_open = src in self._open or dst in self._open
                self._open.discard(src)
                self._open.discard(dst)
            if pair_open:  # the other side ended: end this one the same way
                _reset(dst)
                _reset(src)


def _reset(sock: socket.socket) -> None:
    """End a relayed connection at once: shut down (waking its relay thread), then close with RST
    (SO_LINGER 0), so the peer sees the connection broken rather than politely ended."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes the relay thread blocked in recv on it
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
