"""A fake RunPod: the REST API v2 the adapter speaks, with RunPod's documented shapes and quirks.

Served under `/v2` (`url` ends in /v2): `GET /pods`, `POST /pods` (201, PROVISIONING), `GET|DELETE
/pods/{id}`, `POST /pods/{id}/action` (body exactly `{"action": ...}`; 409 when the pod's status
does not allow it, 422 for another value, terminate 204), `GET /catalog/gpus[/{id}]` (with
`include=AVAILABILITY` only together with `product=POD`, else 400). Errors are problem+json; a
create body with a key the schema lacks is 422 with RunPod's `errors` line; no capacity is 400
with the capacity wording in `detail`. Bearer auth only (no `?api_key=`). The retired GraphQL
path answers 410 Gone.

Pods do not boot by themselves: `boot(id)` makes one RUNNING with `runtime` and, when it was
created with 22/tcp, `ssh.direct` (or set `auto_boot_after_reads`, for demos). `exhaust(gpu_id)`
leaves no capacity for a GPU type. 429s and 5xx come from `inject`.
"""

from __future__ import annotations

import itertools
import re
import time
from datetime import UTC, datetime
from typing import Any

from providers.fakes.base import FakeVendorServer, RecordedCall, Reply, json_reply

__all__ = ["CAPACITY_DETAIL", "FakeRunPod", "sample_runpod_gpu_types"]

CAPACITY_DETAIL = "There are no longer any instances available with the requested specifications."
GRAPHQL_GONE = "The GraphQL API is retired. Use the REST API at https://api.runpod.io/v2."
POD_GONE = "The requested Pod does not exist."
PROBLEM = "application/problem+json"
_CREATE_KEYS = frozenset(
    {
        "name",
        "image",
        "gpu",
        "cpu",
        "cloud",
        "disk",
        "ports",
        "env",
        "mounts",
        "args",
        "registry",
        "dataCenterIds",
        "globalNetworking",
        "startSsh",
        "startJupyter",
        "templateId",
    }
)
_ACTIONS = {
    "PROVISIONING": ("stop", "terminate"),
    "STARTING": ("stop", "terminate"),
    "RUNNING": ("stop", "restart", "terminate"),
    "EXITED": ("start", "terminate"),
    "ERROR": ("start", "terminate"),
    "TERMINATED": (),
}
_POD = re.compile(r"^/v2/pods/([\w-]+)$")
_POD_ACTION = re.compile(r"^/v2/pods/([\w-]+)/action$")
_GPU = re.compile(r"^/v2/catalog/gpus/(.+)$")


def sample_runpod_gpu_types() -> list[dict[str, Any]]:
    """GPU types shaped like the v2 catalog's GpuType; prices per GPU per hour."""

    def gpu(gid: str, name: str, memory: int, secure: float | None, community: float | None) -> dict[str, Any]:
        return {
            "id": gid,
            "name": name,
            "pool": name.replace(" ", "").upper(),
            "manufacturer": "NVIDIA",
            "memory": memory,
            "secure": secure is not None,
            "community": community is not None,
            "price": {"secure": secure, "community": community},
            "maxCount": {"secure": 8 if secure is not None else 0, "community": 4 if community is not None else 0},
        }

    return [
        gpu("NVIDIA GeForce RTX 3090", "RTX 3090", 24, 0.43, 0.22),
        gpu("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.69, 0.34),
        gpu("NVIDIA A40", "A40", 48, 0.35, None),
        gpu("NVIDIA A100 80GB PCIe", "A100 PCIe", 80, 1.64, 1.19),
    ]


def _problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> Reply:
    body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return json_reply(status, body, PROBLEM)


def _last(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeRunPod(FakeVendorServer):
    """RunPod's REST API v2 on loopback (`url` ends in /v2)."""

    provider = "runpod"
    accepts_query_key = False

    def __init__(
        self, *, api_key: str = "fake-runpod-key", gpu_types: list[dict[str, Any]] | None = None, capacity: int = 10
    ) -> None:
        super().__init__(api_key=api_key)
        types = gpu_types if gpu_types is not None else sample_runpod_gpu_types()
        self.gpu_types: dict[str, dict[str, Any]] = {t["id"]: dict(t) for t in types}
        self.capacity: dict[str, int] = dict.fromkeys(self.gpu_types, capacity)
        self.pods: dict[str, dict[str, Any]] = {}
        self.auto_boot_after_reads: int | None = None
        self._reads: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._ports = itertools.count(40022)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v2"

    # -- knobs ---------------------------------------------------------------------------------

    def exhaust(self, gpu_type_id: str) -> None:
        """No capacity left for this GPU type: its availability is NONE and a create answers 400."""
        with self.lock:
            self.capacity[gpu_type_id] = 0

    def boot(self, pod_id: str, *, ip: str = "198.51.100.9", public: bool = True, util: float = 0.0) -> None:
        """The container is up: RUNNING, `runtime` with the ports, `ssh.direct` when 22/tcp is public."""
        with self.lock:
            pod = self.pods[pod_id]
            exposes_ssh = "22/tcp" in (pod.get("ports") or [])
            ports: list[dict[str, Any]] = []
            direct = None
            if exposes_ssh:
                ports.append({"private": 22, "public": None, "type": "tcp", "ip": "10.0.0.5"})
                if public:
                    port = next(self._ports)
                    ports = [{"private": 22, "public": port, "type": "tcp", "ip": ip}]
                    direct = {"host": ip, "port": port, "username": "root", "command": f"ssh root@{ip} -p {port}"}
            pod.update(
                status="RUNNING",
                actions=list(_ACTIONS["RUNNING"]),
                startedAt=_iso(time.time()),
                runtime={
                    "uptime": 12,
                    "gpus": [{"util": util, "memoryUtil": 0.0} for _ in range(int(pod["gpu"]["count"]))],
                    "cpu": {"util": 1.0},
                    "memory": {"util": 5.0},
                    "ports": ports,
                },
                ssh={"direct": direct, "proxy": pod["ssh"]["proxy"]},
            )

    def set_pod(self, pod_id: str, **fields: Any) -> None:
        with self.lock:
            self.pods[pod_id].update(fields)

    def vanish(self, pod_id: str) -> None:
        with self.lock:
            self.pods.pop(pod_id, None)

    # -- the API -------------------------------------------------------------------------------

    def unauthorized(self) -> Reply:
        return _problem(401, "Unauthorized", "missing bearer token")

    def route(self, call: RecordedCall) -> Reply:
        method, path = call.method, call.path.rstrip("/")
        body = call.body
        if path == "/graphql":
            return _problem(410, "Gone", GRAPHQL_GONE)
        if path == "/v2/pods":
            if method == "GET":
                return json_reply(200, {"pods": [dict(p) for p in self.pods.values()]})
            if method == "POST":
                return self._create(body)
        if path == "/v2/catalog/gpus" and method == "GET":
            return self._catalog(call.query)
        if (m := _GPU.match(path)) and method == "GET":
            gpu = self.gpu_types.get(m.group(1))
            if gpu is None:
                return _problem(404, "Not Found", f"GPU type {m.group(1)} does not exist.")
            return json_reply(200, dict(gpu))
        if (m := _POD_ACTION.match(path)) and method == "POST":
            return self._action(m.group(1), body)
        if m := _POD.match(path):
            pod_id = m.group(1)
            if method == "GET":
                return self._read(pod_id)
            if method == "DELETE":
                if self.pods.pop(pod_id, None) is None:
                    return _problem(404, "Not Found", POD_GONE)
                return Reply(204, b"", PROBLEM)
        return _problem(404, "Not Found", f"no route {method} {call.path}")

    def _catalog(self, query: dict[str, list[str]]) -> Reply:
        include = _last(query, "include")
        product = _last(query, "product")
        if (include is None) != (product is None):
            return _problem(400, "Bad Request", "include and product must be given together")
        cloud = str((query.get("cloud") or ["SECURE"])[-1]).upper()
        if cloud not in ("SECURE", "COMMUNITY"):
            return _problem(422, "Unprocessable Entity", "Request validation failed.", [f"cloud: {cloud!r}"])
        count = int((query.get("count") or ["1"])[-1])
        rows = []
        for t in self.gpu_types.values():
            row = dict(t)
            if include == "AVAILABILITY":
                key = cloud.lower()
                left = self.capacity.get(t["id"], 0)
                sold = bool(t.get(key)) and t["price"].get(key) is not None and int(t["maxCount"][key]) >= count
                level = "NONE" if not sold or left < 1 else ("HIGH" if left > 5 else "MEDIUM" if left > 2 else "LOW")
                row["availability"] = level
                if level != "NONE":
                    row["dataCenters"] = [{"id": "EU-RO-1", "name": "EU-RO-1", "availability": level}]
                row["cudaVersions"] = [{"version": "12.4", "available": True}, {"version": "12.8", "available": True}]
            rows.append(row)
        return json_reply(200, {"gpus": rows})

    def _create(self, body: Any) -> Reply:
        if not isinstance(body, dict):
            return _problem(422, "Unprocessable Entity", "Request validation failed.", ["$: expected an object"])
        extra = sorted(set(body) - _CREATE_KEYS)
        if extra:
            names = ", ".join(f"'{k}'" for k in extra)
            errors = [f"$: additional properties {names} not allowed"]
            return _problem(422, "Unprocessable Entity", "Request validation failed.", errors)
        missing = [k for k in ("name", "image") if not body.get(k)]
        gpu = body.get("gpu")
        if missing or not isinstance(gpu, dict) or not gpu.get("id"):
            what = missing or ["gpu.id"]
            return _problem(422, "Unprocessable Entity", "Request validation failed.", [f"$: missing {what}"])
        if not isinstance(body.get("env", {}), dict):
            return _problem(422, "Unprocessable Entity", "Request validation failed.", ["$.env: expected an object"])
        cloud = str(body.get("cloud") or "SECURE")
        if cloud not in ("SECURE", "COMMUNITY"):
            return _problem(422, "Unprocessable Entity", "Request validation failed.", [f"$.cloud: {cloud!r}"])
        gtype = self.gpu_types.get(str(gpu["id"]))
        count = int(gpu.get("count") or 1)
        key = cloud.lower()
        price = None if gtype is None else gtype["price"].get(key)
        if gtype is None or price is None or self.capacity.get(gtype["id"], 0) < 1:
            return _problem(400, "Bad Request", CAPACITY_DETAIL)
        self.capacity[gtype["id"]] -= 1
        pod_id = f"fakepod{next(self._ids):04d}"
        self.pods[pod_id] = {
            "id": pod_id,
            "name": body["name"],
            "status": "PROVISIONING",
            "actions": list(_ACTIONS["PROVISIONING"]),
            "image": body["image"],
            "args": body.get("args"),
            "disk": body.get("disk"),
            "ports": list(body.get("ports") or []),
            "env": dict(body.get("env") or {}),
            "registry": None,
            "mounts": body.get("mounts"),
            "gpu": {"id": gtype["id"], "count": count},
            "cloud": cloud,
            "dataCenterId": "EU-RO-1",
            "cudaVersion": "12.4",
            "ssh": {
                "direct": None,
                "proxy": {
                    "host": "ssh.runpod.io",
                    "port": 22,
                    "username": f"{pod_id}-64410d3c",
                    "command": f"ssh {pod_id}-64410d3c@ssh.runpod.io",
                },
            },
            "template": None,
            "cost": round(float(price) * count, 6),
            "locked": False,
            "globalNetworking": {"enabled": False},
            "runtime": None,
            "createdAt": _iso(time.time()),
            "startedAt": None,
        }
        return json_reply(201, dict(self.pods[pod_id]))

    def _read(self, pod_id: str) -> Reply:
        pod = self.pods.get(pod_id)
        if pod is None:
            return _problem(404, "Not Found", POD_GONE)
        self._reads[pod_id] = self._reads.get(pod_id, 0) + 1
        if (
            self.auto_boot_after_reads is not None
            and pod["status"] in ("PROVISIONING", "STARTING")
            and self._reads[pod_id] > self.auto_boot_after_reads
        ):
            self.boot(pod_id)
        return json_reply(200, dict(pod))

    def _action(self, pod_id: str, body: Any) -> Reply:
        if not isinstance(body, dict) or set(body) != {"action"}:
            return _problem(
                422, "Unprocessable Entity", "Request validation failed.", ['$: the body is exactly {"action": ...}']
            )
        action = body["action"]
        if action not in ("start", "stop", "restart", "terminate"):
            return _problem(
                422, "Unprocessable Entity", "Request validation failed.", [f"$.action: {action!r} is not allowed"]
            )
        pod = self.pods.get(pod_id)
        if pod is None:
            return _problem(404, "Not Found", POD_GONE)
        if action not in _ACTIONS[pod["status"]]:
            return _problem(409, "Conflict", f"Cannot {action} a pod in status {pod['status']}.")
        if action == "terminate":
            del self.pods[pod_id]
            return Reply(204, b"", PROBLEM)
        if action == "stop":
            pod.update(status="EXITED", runtime=None, cost=0.0, ssh={"direct": None, "proxy": pod["ssh"]["proxy"]})
        else:
            gtype = self.gpu_types[pod["gpu"]["id"]]
            rate = gtype["price"].get(pod["cloud"].lower()) or 0.0
            pod.update(
                status="STARTING",
                runtime=None,
                cost=round(float(rate) * int(pod["gpu"]["count"]), 6),
                ssh={"direct": None, "proxy": pod["ssh"]["proxy"]},
            )
        pod["actions"] = list(_ACTIONS[pod["status"]])
        return json_reply(200, dict(pod))
