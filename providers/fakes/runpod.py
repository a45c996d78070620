"""A fake RunPod: the GraphQL operations the adapter sends, with RunPod's documented shapes and quirks.

It does not parse GraphQL: it reads the root field of the operation and the `variables`. It
REFUSES a query with a string literal in it (values must travel in `variables`, never be
formatted into the query). Replayed quirks: errors inside HTTP 200, `runtime` null until `boot`,
ports listed only once running (public or not), per-GPU prices, the capacity error on deploy
when a GPU type's `capacity` is 0, `desiredStatus` EXITED after stop, a terminated pod reading
as `null`, HTTP 401 for a bad key. 429s and 5xx come from `inject`.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Any

from providers.fakes.base import FakeVendorServer, RecordedCall, Reply, json_reply

__all__ = ["FakeRunPod", "sample_runpod_gpu_types"]

CAPACITY_ERROR = (
    "There are no longer any instances available with the requested specifications. Please refresh and try again."
)
_ROOT = re.compile(r"\{\s*([A-Za-z_]\w*)")


def sample_runpod_gpu_types() -> list[dict[str, Any]]:
    """GPU types shaped like `gpuTypes` answers; prices per GPU per hour."""
    return [
        {
            "id": "NVIDIA GeForce RTX 3090",
            "displayName": "RTX 3090",
            "memoryInGb": 24,
            "securePrice": 0.43,
            "communityPrice": 0.22,
        },
        {
            "id": "NVIDIA GeForce RTX 4090",
            "displayName": "RTX 4090",
            "memoryInGb": 24,
            "securePrice": 0.69,
            "communityPrice": 0.34,
        },
        {"id": "NVIDIA A40", "displayName": "A40", "memoryInGb": 48, "securePrice": 0.35, "communityPrice": None},
        {
            "id": "NVIDIA A100 80GB PCIe",
            "displayName": "A100 PCIe",
            "memoryInGb": 80,
            "securePrice": 1.64,
            "communityPrice": 1.19,
        },
    ]


def _data(payload: dict[str, Any]) -> Reply:
    return json_reply(200, {"data": payload})


def _error(message: str, field: str | None = None) -> Reply:
    """RunPod's way: HTTP 200, the message under `errors`, `data` null for the failed field."""
    return json_reply(
        200,
        {"errors": [{"message": message, "path": [field] if field else []}], "data": {field: None} if field else None},
    )


class FakeRunPod(FakeVendorServer):
    """RunPod's GraphQL endpoint on loopback (`url` ends in /graphql)."""

    provider = "runpod"

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
        return f"http://127.0.0.1:{self.port}/graphql"

    # -- knobs ---------------------------------------------------------------------------------

    def exhaust(self, gpu_type_id: str) -> None:
        """No capacity left for this GPU type: deploy answers the capacity error."""
        with self.lock:
            self.capacity[gpu_type_id] = 0

    def boot(self, pod_id: str, *, ip: str = "198.51.100.9", public: bool = True, util: float = 0.0) -> None:
        """The container is up: `runtime` appears, with 22/tcp public (or only private)."""
        with self.lock:
            pod = self.pods[pod_id]
            pod["runtime"] = {
                "uptimeInSeconds": 12,
                "ports": [
                    {"ip": "10.0.0.5", "isIpPublic": False, "privatePort": 22, "publicPort": 22, "type": "tcp"},
                    *(
                        [
                            {
                                "ip": ip,
                                "isIpPublic": True,
                                "privatePort": 22,
                                "publicPort": next(self._ports),
                                "type": "tcp",
                            }
                        ]
                        if public
                        else []
                    ),
                ],
                "gpus": [{"id": f"GPU-{pod_id}-{i}", "gpuUtilPercent": util} for i in range(pod["gpuCount"])],
            }

    def set_pod(self, pod_id: str, **fields: Any) -> None:
        with self.lock:
            self.pods[pod_id].update(fields)

    def vanish(self, pod_id: str) -> None:
        with self.lock:
            self.pods.pop(pod_id, None)

    # -- the API -------------------------------------------------------------------------------

    def operation(self, body: Any) -> str | None:
        query = body.get("query") if isinstance(body, dict) else None
        if not isinstance(query, str):
            return None
        m = _ROOT.search(query)
        return m.group(1) if m else None

    def unauthorized(self) -> Reply:
        return json_reply(401, {"errors": [{"message": "Unauthorized"}]})

    def route(self, call: RecordedCall) -> Reply:
        if call.method != "POST" or call.path != "/graphql":
            return json_reply(404, {"errors": [{"message": f"no route {call.method} {call.path}"}]})
        body = call.body if isinstance(call.body, dict) else {}
        query = body.get("query")
        variables = body.get("variables") or {}
        if not isinstance(query, str) or not isinstance(variables, dict):
            return json_reply(400, {"errors": [{"message": "POST a JSON body with `query` and `variables`"}]})
        if '"' in query:
            return _error("fake runpod: string literal in the query; pass values in `variables`")
        op = call.operation
        if op == "gpuTypes":
            return self._gpu_types(int(variables.get("gpuCount") or 1))
        if op == "podFindAndDeployOnDemand":
            return self._deploy(variables.get("input") or {})
        if op == "pod":
            return self._pod(str(variables.get("podId")))
        if op == "myself":
            return _data({"myself": {"pods": [self._view(p) for p in self.pods.values()]}})
        if op in ("podStop", "podResume", "podTerminate"):
            return self._lifecycle(op, str(variables.get("podId")), variables)
        return _error(f"Cannot query field {op!r} on type Query/Mutation")

    def _gpu_types(self, gpu_count: int) -> Reply:
        rows = []
        for t in self.gpu_types.values():
            in_stock = self.capacity.get(t["id"], 0) > 0
            price = t.get("communityPrice") or t.get("securePrice")
            rows.append(
                {
                    **t,
                    "lowestPrice": {
                        "minimumBidPrice": None if price is None else round(price * 0.6, 3),
                        "uninterruptablePrice": price,
                        "stockStatus": ("High" if self.capacity[t["id"]] > 3 else "Low") if in_stock else None,
                    },
                }
            )
        return _data({"gpuTypes": rows})

    def _deploy(self, spec: dict[str, Any]) -> Reply:
        gtype = self.gpu_types.get(str(spec.get("gpuTypeId")))
        count = int(spec.get("gpuCount") or 1)
        if (
            gtype is None
            or self.capacity.get(gtype["id"], 0) < 1
            or (spec.get("cloudType") == "COMMUNITY" and not gtype.get("communityPrice"))
        ):
            return _error(CAPACITY_ERROR, "podFindAndDeployOnDemand")
        self.capacity[gtype["id"]] -= 1
        pod_id = f"fakepod{next(self._ids):04d}"
        price = gtype.get("communityPrice") if spec.get("cloudType") == "COMMUNITY" else gtype.get("securePrice")
        self.pods[pod_id] = {
            "id": pod_id,
            "name": spec.get("name"),
            "desiredStatus": "RUNNING",
            "lastStatusChange": f"Rented by User: {time.strftime('%a %b %d %Y %H:%M:%S GMT+0000')}",
            "costPerHr": round(float(price or 0) * count, 6),
            "gpuCount": count,
            "machineId": f"m{next(self._ids):05d}",
            "imageName": spec.get("imageName"),
            "env": spec.get("env") or [],
            "ports": spec.get("ports"),
            "runtime": None,
            "containerDiskInGb": spec.get("containerDiskInGb"),
            "machine": {"podHostId": f"{pod_id}-host"},
        }
        pod = self.pods[pod_id]
        return _data(
            {
                "podFindAndDeployOnDemand": {
                    "id": pod_id,
                    "desiredStatus": "RUNNING",
                    "machineId": pod["machineId"],
                    "machine": pod["machine"],
                }
            }
        )

    def _view(self, pod: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in pod.items() if k not in ("env", "machine", "containerDiskInGb", "ports")}

    def _pod(self, pod_id: str) -> Reply:
        pod = self.pods.get(pod_id)
        if pod is None:
            return _data({"pod": None})
        self._reads[pod_id] = self._reads.get(pod_id, 0) + 1
        if (
            self.auto_boot_after_reads is not None
            and pod["runtime"] is None
            and pod["desiredStatus"] == "RUNNING"
            and self._reads[pod_id] > self.auto_boot_after_reads
        ):
            self.boot(pod_id)
        return _data({"pod": self._view(pod)})

    def _lifecycle(self, op: str, pod_id: str, variables: dict[str, Any]) -> Reply:
        pod = self.pods.get(pod_id)
        if pod is None:
            return _error(f"Pod not found: {pod_id}", op)
        if op == "podTerminate":
            del self.pods[pod_id]
            return _data({"podTerminate": None})
        if op == "podStop":
            pod.update(desiredStatus="EXITED", runtime=None, lastStatusChange="Exited by user")
        else:
            pod.update(
                desiredStatus="RUNNING",
                runtime=None,
                lastStatusChange="Resumed by user",
                gpuCount=int(variables.get("gpuCount") or pod["gpuCount"]),
            )
        return _data({op: {"id": pod_id, "desiredStatus": pod["desiredStatus"]}})
