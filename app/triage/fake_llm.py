"""A local fake of an OpenAI-compatible chat endpoint: real HTTP on 127.0.0.1, for tests and demos.

    with FakeLlmServer(key="sk-test", answer=lambda prompt: "oom") as fake:
        os.environ["TUNEHARNESS_LLM_URL"] = fake.url   # http://127.0.0.1:PORT/v1

It checks the bearer key (401 otherwise), answers `{"state": ...}` JSON from `answer(prompt)`
(default: the rules stage's guess for the prompt), reports `usage` token counts (characters / 4)
and records each request body for the test to inspect.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from app.triage.rules import UNSURE, classify

__all__ = ["FakeLlmServer"]


def _default_answer(prompt: str) -> str:
    v = classify(prompt)
    return v.guess if v.state == UNSURE else v.state


class FakeLlmServer:
    """A threaded HTTP server speaking the `/v1/chat/completions` subset the chain uses."""

    def __init__(
        self,
        *,
        key: str | None = None,
        answer: Callable[[str], str] | None = None,
        status: int = 200,
        usage: bool = True,
    ) -> None:
        self.key = key
        self.answer = answer or _default_answer
        self.status = status
        self.usage = usage
        self.requests: list[dict[str, Any]] = []
        self.auth_headers: list[str | None] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> FakeLlmServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                auth = self.headers.get("Authorization")
                fake.auth_headers.append(auth)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._reply(404, {"error": {"message": "not found"}})
                    return
                if fake.key is not None and auth != f"Bearer {fake.key}":
                    self._reply(401, {"error": {"message": "invalid api key"}})
                    return
                try:
                    body = json.loads(raw)
                    prompt = "\n".join(str(m.get("content", "")) for m in body["messages"] if m.get("role") == "user")
                except (ValueError, KeyError, TypeError, AttributeError):
                    self._reply(400, {"error": {"message": "bad request"}})
                    return
                fake.requests.append(body)
                if fake.status != 200:
                    self._reply(fake.status, {"error": {"message": "fake failure"}})
                    return
                content = json.dumps({"state": fake.answer(prompt), "reason": "fake"})
                reply: dict[str, Any] = {
                    "id": f"chatcmpl-fake-{len(fake.requests)}",
                    "object": "chat.completion",
                    "model": body.get("model", "fake"),
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                    ],
                }
                if fake.usage:
                    all_text = "".join(str(m.get("content", "")) for m in body["messages"])
                    reply["usage"] = {
                        "prompt_tokens": max(1, len(all_text) // 4),
                        "completion_tokens": max(1, len(content) // 4),
                        "total_tokens": max(1, len(all_text) // 4) + max(1, len(content) // 4),
                    }
                self._reply(200, reply)

            def _reply(self, status: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLlmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
