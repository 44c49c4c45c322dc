"""A TCP proxy on loopback that makes every request to the API server arrive late.

It forwards bytes both ways unchanged (TLS goes end to end: the client still verifies the API
server's certificate, issued for 127.0.0.1), but holds back each TLS application-data record
(content type 23) from client to server for `delay` seconds, in order. The handshake is not
delayed, so connecting costs what it always does and each HTTP request, whatever its size, is
answered `delay` seconds later than without the proxy: the API latency of a loaded or distant
server, on the one path the test points through it.
"""

from __future__ import annotations

import heapq
import socket
import threading
import time

APPLICATION_DATA = 23
HEADER = 5  # content type, version (2), length (2)


class SlowProxy:
    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="slowproxy").start()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                try:
                    s.close()
                except OSError:
                    pass

    def __enter__(self) -> SlowProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client), daemon=True).start()

    def _answers(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _requests(self, src: socket.socket, dst: socket.socket) -> None:
        """Split the client's stream into TLS records; each goes out at its release time: now for
        handshake records, now + delay for application data, never before the one before it."""
        queue: list[tuple[float, int, bytes]] = []
        cond = threading.Condition()
        done = threading.Event()
        sequence = 0

        def sender() -> None:
            while True:
                with cond:
                    while not queue and not done.is_set():
                        cond.wait(0.5)
                    if not queue and done.is_set():
                        return
                    due, _, record = queue[0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        cond.wait(wait)
                        continue
                    heapq.heappop(queue)
                try:
                    dst.sendall(record)
                except OSError:
                    return

        threading.Thread(target=sender, daemon=True).start()
        buf, last_due = b"", 0.0
        try:
            while data := src.recv(65536):
                buf += data
                while len(buf) >= HEADER:
                    size = HEADER + int.from_bytes(buf[3:5], "big")
                    if len(buf) < size:
                        break
                    record, buf = buf[:size], buf[size:]
                    hold = self.delay if record[0] == APPLICATION_DATA else 0.0
                    last_due = max(last_due, time.monotonic() + hold)
                    with cond:
                        sequence += 1
                        heapq.heappush(queue, (last_due, sequence, record))
                        cond.notify()
        except OSError:
            pass
        finally:
            done.set()
            with cond:
                cond.notify()
