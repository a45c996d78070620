"""A fake Vast.ai: the calls the adapter (and vast-cli) make, with Vast's documented shapes and quirks.

The instance list is `GET /api/v1/instances/`: JSON-text query values (`select_filters`,
`order_by`, `limit` at most 25, `after_token`), pages behind an opaque `next_token` (base64 of
`{"values": {"id": n}}`), `instances_found` / `total_instances` / `label_counts`, 400
`invalid_token` for a token it did not issue, 400 `invalid_request` for a filter on a computed
column. The v0 list answers Vast's 410 `deprecated_endpoint`.

Replayed v0 quirks: one instance under the plural key `instances` and `null` once gone (or a 404
with `gone_as_404`), `HostPort` as a string and `ports` empty until running, `gpu_ram` in MB,
`no_such_ask` (404) for a taken offer, `search_quota_exceeded` (429, daily) with
`quota_exceeded = True`, JSON 401 for a bad key, `datacenter` in a search read as
`hosting_type == 1`. Pending price increases come from `raise_price(id, ...)` and are answered
with body exactly `{"pending_price_increase_id": n}` (anything else 400; stale 404). Plain-text
429s and 5xx come from `inject`.

Instances do not boot by themselves: call `boot(id)` (or set `auto_boot_after_reads`, for demos).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re
import time
from collections.abc import Callable
from typing import Any

from providers.fakes.base import FakeVendorServer, RecordedCall, Reply, json_reply

__all__ = ["FakeVast", "sample_vast_offers"]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "gt": lambda a, b: a is not None and a > b,
    "gte": lambda a, b: a is not None and a >= b,
    "lt": lambda a, b: a is not None and a < b,
    "lte": lambda a, b: a is not None and a <= b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}
_NOT_FILTERS = {"order", "type", "limit", "allocated_storage", "datacenter"}
_COMPUTED_COLUMNS = {"dph_total", "num_gpus", "duration"}  # not stored: the v1 list refuses them
PAGE_ROWS = 25
V0_LIST_GONE = {
    "success": False,
    "error": "deprecated_endpoint",
    "msg": "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead.",
}
_INSTANCE = re.compile(r"^/api/v0/instances/(\d+)/$")
_INSTANCE_SSH = re.compile(r"^/api/v0/instances/(\d+)/ssh/$")
_ASK = re.compile(r"^/api/v0/asks/(\d+)/$")
_ANSWER = re.compile(r"^/api/v0/instances/(accept|reject)-price-increase/$")


def sample_vast_offers() -> list[dict[str, Any]]:
    """A handful of offers shaped like `/bundles/` answers (for demos and tests)."""
    base = {
        "verified": True,
        "external": False,
        "rentable": True,
        "rented": False,
        "num_gpus": 1,
        "cpu_ram": 64000,
        "disk_space": 200.0,
        "inet_up": 600.0,
        "cuda_max_good": 12.4,
        "driver_version": "550.54.14",
        "compute_cap": 860,
        "geolocation": "Poland, PL",
        "hosting_type": 0,
    }
    rows = [
        (5001, 41, "RTX 3090", 24576, 0.11, 0.15, 0.002, 800.0, 0.995),
        (5002, 42, "RTX 4090", 24564, 0.29, 0.10, 0.003, 950.0, 0.998),
        (5003, 43, "RTX 3090", 24576, 0.09, 0.40, 0.020, 90.0, 0.91),
        (5004, 44, "A100 SXM4", 81920, 0.78, 0.20, 0.0, 2000.0, 0.999),
    ]
    datacenter = {5004}
    return [
        {
            **base,
            "id": oid,
            "ask_contract_id": oid,
            "machine_id": mid,
            "host_id": 900 + mid,
            "gpu_name": name,
            "gpu_ram": ram_mb,
            "dph_base": dph * 0.9,
            "dph_total": dph,
            "storage_cost": storage,
            "inet_up_cost": down,
            "inet_down_cost": down,
            "inet_down": mbps,
            "reliability": rel,
            "reliability2": rel,
            "dlperf": 30.0,
            "score": 100.0,
            "hosting_type": 1 if oid in datacenter else 0,
        }
        for oid, mid, name, ram_mb, dph, storage, down, mbps, rel in rows
    ]


class FakeVast(FakeVendorServer):
    """Vast.ai's REST API on loopback, with knobs for every failure the adapter must survive."""

    provider = "vast"

    def __init__(self, *, api_key: str = "fake-vast-key", offers: list[dict[str, Any]] | None = None) -> None:
        super().__init__(api_key=api_key)
        self.offers: dict[str, dict[str, Any]] = {str(o["id"]): dict(o) for o in (offers or [])}
        self.instances: dict[str, dict[str, Any]] = {}
        self.quota_exceeded = False
        self.gone_as_404 = False
        self.auto_boot_after_reads: int | None = None
        self._reads: dict[str, int] = {}
        self.price_increases: dict[int, dict[str, Any]] = {}
        self.answered_increases: list[tuple[int, str]] = []  # (pending id, "accept" | "reject")
        self._ids = itertools.count(7_000_001)
        self._increase_ids = itertools.count(301)
        self._ports = itertools.count(41022)

    # -- knobs ---------------------------------------------------------------------------------

    def add_offer(self, **fields: Any) -> str:
        """Add an offer (defaults from the first sample); returns its ask id."""
        with self.lock:
            rec = {**sample_vast_offers()[0], "id": next(self._ids), **fields}
            rec.setdefault("ask_contract_id", rec["id"])
            self.offers[str(rec["id"])] = rec
            return str(rec["id"])

    def take_offer(self, offer_id: str) -> None:
        """Someone else rents it: it leaves search and create answers `no_such_ask`."""
        with self.lock:
            self.offers.pop(str(offer_id), None)

    def boot(self, instance_id: str, *, ip: str = "203.0.113.7", status_msg: str = "success, running") -> None:
        """The instance finishes loading: running, with a direct 22/tcp mapping (HostPort a string)."""
        with self.lock:
            rec = self.instances[str(instance_id)]
            rec.update(
                actual_status="running",
                cur_state="running",
                status_msg=status_msg,
                public_ipaddr=ip,
                ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(next(self._ports))}]},
                gpu_util=0.0,
            )

    def set_instance(self, instance_id: str, **fields: Any) -> None:
        with self.lock:
            self.instances[str(instance_id)].update(fields)

    def add_instance(self, **fields: Any) -> str:
        """An instance that exists already (rented elsewhere, or before a test began); returns its id."""
        with self.lock:
            iid = str(next(self._ids))
            self.instances[iid] = {**_instance_row(iid, {}, {}), **fields, "id": int(iid)}
            return iid

    def raise_price(
        self,
        instance_id: str,
        *,
        new_gpu_costpersec: float,
        new_disk_ram_costpersec: float | None = None,
        platform_fee: float | None = None,
        starts_in_s: float = 86_400.0,
    ) -> int:
        """The host asks a higher price for this instance; returns the pending increase's id."""
        with self.lock:
            rec = self.instances[str(instance_id)]
            old_gpu = float(rec.get("dph_total") or 0.0) / 3600.0
            pid = next(self._increase_ids)
            now = time.time()
            self.price_increases[pid] = {
                "pending_price_increase_id": pid,
                "contract_id": int(instance_id),
                "host_id": rec.get("host_id"),
                "new_gpu_costpersec": new_gpu_costpersec,
                "new_disk_ram_costpersec": new_disk_ram_costpersec,
                "new_bwu_cost": None,
                "new_bwd_cost": None,
                "new_platform_fee": platform_fee,
                "old_gpu_costpersec": old_gpu,
                "old_disk_ram_costpersec": 0.0,
                "old_bwu_cost": None,
                "old_bwd_cost": None,
                "old_platform_fee": platform_fee,
                "contract_end_date": now + starts_in_s,
                "ask_end_date": now + starts_in_s + 30 * 86_400.0,
                "created_at": now,
            }
            return pid

    def vanish(self, instance_id: str) -> None:
        """The host disappears: the instance reads as `null` (or 404 with `gone_as_404`)."""
        with self.lock:
            self.instances.pop(str(instance_id), None)

    # -- the API -------------------------------------------------------------------------------

    def route(self, call: RecordedCall) -> Reply:
        method, path, body = call.method, call.path, call.body
        if method == "POST" and path == "/api/v0/bundles/":
            return self._search(body if isinstance(body, dict) else {})
        if method == "GET" and path == "/api/v1/instances/":
            return self._list(call.query)
        if method == "GET" and path == "/api/v0/instances/":
            return json_reply(410, V0_LIST_GONE)
        if path == "/api/v0/instances/pending-price-increases/" and method == "GET":
            rows = [dict(r) for r in self.price_increases.values()]
            return json_reply(
                200, {"success": True, "count": len(rows), "truncated": False, "pending_price_increases": rows}
            )
        if (m := _ANSWER.match(path)) and method == "PUT":
            return self._answer(m.group(1), body)
        if (m := _ASK.match(path)) and method == "PUT":
            return self._create(m.group(1), body if isinstance(body, dict) else {})
        if (m := _INSTANCE_SSH.match(path)) and method == "POST":
            rec = self.instances.get(m.group(1))
            if rec is None:
                return _no_instance(m.group(1))
            rec.setdefault("ssh_keys", []).append((body or {}).get("ssh_key"))
            return json_reply(200, {"success": True})
        if m := _INSTANCE.match(path):
            return self._instance(method, m.group(1), body if isinstance(body, dict) else {})
        return json_reply(404, {"success": False, "error": "not_found", "msg": f"no route {method} {path}"})

    def _search(self, body: dict[str, Any]) -> Reply:
        if self.quota_exceeded:
            return json_reply(
                429,
                {
                    "success": False,
                    "error": "search_quota_exceeded",
                    "msg": "You have exceeded your daily search quota.",
                },
            )
        rows = [r for r in self.offers.values() if _matches(r, body)]
        datacenter = body.get("datacenter")
        if isinstance(datacenter, dict) and "eq" in datacenter:
            rows = [r for r in rows if (r.get("hosting_type") == 1) == bool(datacenter["eq"])]
        for field_name, direction in reversed(body.get("order") or []):
            rows.sort(key=_sort_key(str(field_name)), reverse=direction == "desc")
        limit = body.get("limit")
        if isinstance(limit, int):
            rows = rows[:limit]
        return json_reply(200, {"offers": [dict(r) for r in rows]})

    def _create(self, offer_id: str, body: dict[str, Any]) -> Reply:
        offer = self.offers.pop(offer_id, None)
        if offer is None:
            return json_reply(
                404,
                {
                    "success": False,
                    "error": "no_such_ask",
                    "msg": f"Instance type by id {offer_id} is not available.",
                },
            )
        iid = str(next(self._ids))
        self.instances[iid] = _instance_row(iid, offer, body)
        return json_reply(200, {"success": True, "new_contract": int(iid)})

    def _list(self, query: dict[str, list[str]]) -> Reply:
        """One page of the v1 list, as Vast serves it (keyset cursor on the row order)."""
        try:
            filters = json.loads(_one(query, "select_filters") or "{}")
            order = json.loads(_one(query, "order_by") or '[{"col": "id", "dir": "asc"}]')
            limit = int(_one(query, "limit") or PAGE_ROWS)
        except ValueError as exc:
            return _bad("invalid_request", f"Error in query parameters: {exc}")
        if not isinstance(filters, dict) or not isinstance(order, list):
            return _bad("invalid_request", "Error in query parameters: select_filters is an object, order_by a list")
        for column in [*filters, *(str(o.get("col")) for o in order if isinstance(o, dict))]:
            if column in _COMPUTED_COLUMNS:
                return _bad("invalid_request", f"Error in query parameters: {column} is not a valid search key")
        limit = 5 if limit <= 0 else min(limit, PAGE_ROWS)
        rows = [r for r in self.instances.values() if _matches(r, filters)]
        keys = [(str(o.get("col")), o.get("dir") == "desc") for o in order if isinstance(o, dict)]
        if "id" not in (k for k, _ in keys):
            keys.append(("id", False))
        for column, desc in reversed(keys):
            rows.sort(key=_sort_key(column), reverse=desc)
        start = 0
        token = _one(query, "after_token")
        if token is not None:
            after = _token_id(token)
            ids = [r["id"] for r in rows]
            if after is None or after not in ids:
                return _bad("invalid_token", "Error in query parameters: after_token is not a valid token")
            start = ids.index(after) + 1
        page = rows[start : start + limit]
        more = start + limit < len(rows)
        labels: dict[str, int] = {}
        for r in rows:
            labels[str(r.get("label") or "")] = labels.get(str(r.get("label") or ""), 0) + 1
        return json_reply(
            200,
            {
                "success": True,
                "instances_found": len(page),
                "total_instances": len(rows),
                "label_counts": labels,
                "next_token": _token(page[-1]["id"]) if more and page else None,
                "instances": [dict(r) for r in page],
            },
        )

    def _answer(self, verb: str, body: Any) -> Reply:
        if not isinstance(body, dict) or set(body) != {"pending_price_increase_id"}:
            return _bad("invalid_request", 'the body must be exactly {"pending_price_increase_id": <int>}')
        pid = body["pending_price_increase_id"]
        if isinstance(pid, bool) or not isinstance(pid, int):
            return _bad("invalid_request", "pending_price_increase_id must be an integer")
        row = self.price_increases.pop(pid, None)
        if row is None:
            return json_reply(404, {"success": False, "error": "no_pending_price_increase"})
        self.answered_increases.append((pid, verb))
        iid = str(row["contract_id"])
        if verb == "accept" and iid in self.instances:
            rate = float(row["new_gpu_costpersec"]) + float(row.get("new_disk_ram_costpersec") or 0.0)
            self.instances[iid]["dph_total"] = round(rate * 3600.0, 6)
        return json_reply(200, {"success": True, "pending_price_increase_id": pid, "contract_id": int(iid)})

    def _instance(self, method: str, iid: str, body: dict[str, Any]) -> Reply:
        rec = self.instances.get(iid)
        if method == "GET":
            if rec is None:
                return _no_instance(iid) if self.gone_as_404 else json_reply(200, {"instances": None})
            self._reads[iid] = self._reads.get(iid, 0) + 1
            if (
                self.auto_boot_after_reads is not None
                and rec.get("actual_status") != "running"
                and rec.get("intended_status") == "running"
                and self._reads[iid] > self.auto_boot_after_reads
            ):
                self.boot(iid)
            return json_reply(200, {"instances": dict(rec)})
        if rec is None:
            return _no_instance(iid)
        if method == "DELETE":
            del self.instances[iid]
            return json_reply(200, {"success": True})
        if method == "PUT":
            if body.get("state") == "stopped":
                rec.update(
                    intended_status="stopped",
                    cur_state="stopped",
                    actual_status="exited",
                    ports={},
                    gpu_util=None,
                    status_msg="stopped by user",
                )
            elif body.get("state") == "running":
                rec.update(
                    intended_status="running", cur_state="running", actual_status="loading", status_msg="starting"
                )
            if "label" in body:
                rec["label"] = body["label"]
            return json_reply(200, {"success": True})
        return json_reply(405, {"success": False, "error": "method_not_allowed", "msg": method})


def _sort_key(field_name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda rec: rec.get(field_name) or 0


def _instance_row(iid: str, offer: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A new instance as Vast lists it: not yet loading, no ports, the proxy already known."""
    env = body.get("env") if isinstance(body.get("env"), dict) else {}
    return {
        "id": int(iid),
        "machine_id": offer.get("machine_id"),
        "host_id": offer.get("host_id"),
        "label": body.get("label"),
        "image_uuid": body.get("image"),
        "disk_space": body.get("disk"),
        "env": body.get("env"),
        "extra_env": [[k, v] for k, v in (env or {}).items()],
        "onstart": body.get("onstart"),
        "gpu_name": offer.get("gpu_name"),
        "num_gpus": offer.get("num_gpus"),
        "gpu_ram": offer.get("gpu_ram"),
        "dph_total": offer.get("dph_total"),
        "storage_cost": offer.get("storage_cost"),
        "actual_status": None,
        "intended_status": "running",
        "cur_state": "running",
        "status_msg": None,
        "ssh_host": f"ssh{int(iid) % 9}.vast.ai",
        "ssh_port": 20000 + int(iid) % 10000,
        "public_ipaddr": None,
        "ports": {},
        "gpu_util": None,
        "start_date": time.time(),
    }


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _token(row_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"values": {"id": row_id}}).encode()).decode()


def _token_id(token: str) -> int | None:
    try:
        values = json.loads(base64.urlsafe_b64decode(token.encode()))["values"]
        return int(values["id"])
    except (binascii.Error, ValueError, KeyError, TypeError):
        return None


def _bad(error: str, msg: str) -> Reply:
    return json_reply(400, {"success": False, "error": error, "msg": msg})


def _no_instance(iid: str) -> Reply:
    return json_reply(404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."})


def _matches(rec: dict[str, Any], body: dict[str, Any]) -> bool:
    for field_name, cond in body.items():
        if field_name in _NOT_FILTERS or not isinstance(cond, dict):
            continue
        for op, value in cond.items():
            check = _OPS.get(op)
            if check is None or not check(rec.get(field_name), value):
                return False
    return True
