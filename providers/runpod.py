"""RunPod adapter: the REST API v2 (`https://api.runpod.io/v2`), spoken with httpx (no vendor SDK).

Quirks handled here (see ../shared/reference/providers-2026.md):
- Bearer auth only; errors are RFC 9457 problem+json (`title`, `status`, `detail`, `errors`):
  400 is a cross-field rule OR no capacity (only `detail` tells), 402 no balance, 401/403 a
  refused key, 404 an unknown pod, 409 an action not allowed in the pod's status, 422 a body the
  schema refuses (never retried), 429 with `Retry-After`, 5xx transient;
- a pod has SSH only when created with `ports: ["22/tcp"]`, and is ready only when RUNNING with
  `ssh.direct` (or a public 22/tcp in `runtime.ports`): until then it is `loading`. The proxy
  (`ssh.runpod.io`) is shell only, no SFTP, so it is not an endpoint the harness can use;
- GPU prices are per GPU per hour: an offer's `dph_total` is the price times its GPU count;
- pods carry our label in their `name`; `status` is observed state, not intent. The pod has no
  machine id: `Instance.machine_id` is None.

RunPod sells GPU types, not machines: an offer is (GPU type, count) in one cloud, its `offer_id`
is the GPU type id and its `raw["cloud"]` the cloud it was found in (COMMUNITY, or SECURE for
`OfferQuery.datacenter_only`); the create rents in that cloud. RunPod has no onstart hook:
`LaunchSpec.onstart` travels as the env variable TUNEHARNESS_ONSTART and the harness runs it over
SSH; the SSH key travels as PUBLIC_KEY, which RunPod's images install for root.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx

from app.errors import SettingsError
from app.market import (
    AuthFailed,
    Instance,
    InstanceState,
    LaunchSpec,
    Offer,
    OfferGone,
    OfferQuery,
    PriceIncrease,
    ProviderBusy,
    ProviderError,
    QuotaExhausted,
    SSHEndpoint,
)
from providers.http import (
    RETRYABLE_STATUS,
    Failure,
    RetryPolicy,
    Translate,
    VendorClient,
    api_settings,
    body_json,
    body_text,
)

__all__ = ["CAPACITY_WORDS", "DEFAULT_URL", "RunPodMarket", "runpod_instance", "runpod_offer"]

DEFAULT_URL = "https://api.runpod.io/v2"
PROVIDER = "runpod"
COMMUNITY, SECURE = "COMMUNITY", "SECURE"
# How a 400 says "no capacity" (RunPod's wording is not documented: GraphQL's phrase and kin).
CAPACITY_WORDS = (
    "no longer any instances available",
    "no instances available",
    "not enough capacity",
    "no capacity",
    "out of capacity",
    "insufficient capacity",
    "no gpus available",
)
_RETRY_AFTER_CAP_S = 60.0


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None  # a vendor's NaN or infinity is no number


def _cloud_key(cloud: str) -> str:
    return "secure" if cloud == SECURE else "community"


def runpod_offer(rec: Mapping[str, Any], *, gpu_count: int, cloud: str = COMMUNITY) -> Offer | None:
    """A catalog GpuType as an Offer for `gpu_count` GPUs in `cloud`; None when not rentable there."""
    key = _cloud_key(cloud)
    prices = rec.get("price") if isinstance(rec.get("price"), Mapping) else {}
    per_gpu = _float((prices or {}).get(key))
    max_count = rec.get("maxCount") if isinstance(rec.get("maxCount"), Mapping) else {}
    most = (max_count or {}).get(key)
    if (
        per_gpu is None
        or per_gpu <= 0
        or rec.get(key) is False
        or str(rec.get("availability") or "NONE").upper() == "NONE"
        or (isinstance(most, int) and not isinstance(most, bool) and most < gpu_count)
    ):
        return None
    cudas = [
        str(c["version"])
        for c in rec.get("cudaVersions") or []
        if isinstance(c, Mapping) and c.get("available") and c.get("version") is not None
    ]
    return Offer(
        provider=PROVIDER,
        offer_id=str(rec["id"]),
        machine_id=None,
        gpu_name=str(rec.get("name") or rec["id"]),
        num_gpus=gpu_count,
        gpu_ram_gb=_float(rec.get("memory")) or 0.0,
        dph_total=round(per_gpu * gpu_count, 6),  # prices are per GPU
        storage_per_gb_month=None,  # not in the API: unknown, flagged by the pricing
        inet_down_per_gb=None,
        inet_down_mbps=None,
        reliability=None,
        cuda_max=max(cudas, key=_version) if cudas else None,
        raw={**rec, "cloud": cloud},
    )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in text.split("."))


def _direct_ssh(rec: Mapping[str, Any]) -> SSHEndpoint | None:
    """`ssh.direct`, else the public 22/tcp of `runtime.ports` (the same door, older field)."""
    ssh = rec.get("ssh") if isinstance(rec.get("ssh"), Mapping) else None
    direct = (ssh or {}).get("direct")
    if isinstance(direct, Mapping) and direct.get("host") and direct.get("port") is not None:
        try:
            return SSHEndpoint(
                host=str(direct["host"]), port=int(direct["port"]), user=str(direct.get("username") or "root")
            )
        except (TypeError, ValueError):
            pass
    runtime = rec.get("runtime") if isinstance(rec.get("runtime"), Mapping) else None
    for port in (runtime or {}).get("ports") or []:
        if (
            isinstance(port, Mapping)
            and port.get("private") == 22
            and str(port.get("type") or "tcp").lower() == "tcp"
            and port.get("ip")
            and port.get("public") is not None
        ):
            try:
                return SSHEndpoint(host=str(port["ip"]), port=int(port["public"]))
            except (TypeError, ValueError):
                continue
    return None


def _state(status: Any, ssh: SSHEndpoint | None) -> InstanceState:
    if status == "RUNNING":
        return "running" if ssh is not None else "loading"
    if status == "PROVISIONING":
        return "pending"
    if status == "STARTING":
        return "loading"
    if status == "EXITED":
        return "stopped"
    if status == "ERROR":
        return "exited"
    if status == "TERMINATED":
        return "gone"
    return "unknown"


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def runpod_instance(rec: Mapping[str, Any] | None, instance_id: str, *, now: float | None = None) -> Instance:
    """A v2 Pod as an Instance; `None` (a 404) reads as gone."""
    if rec is None:
        return Instance.gone(PROVIDER, instance_id)
    ssh = _direct_ssh(rec)
    status = rec.get("status")
    state = _state(status, ssh)
    runtime = rec.get("runtime") if isinstance(rec.get("runtime"), Mapping) else None
    utils = [
        u
        for u in (_float(g.get("util")) for g in (runtime or {}).get("gpus") or [] if isinstance(g, Mapping))
        if u is not None
    ]
    started = _epoch(rec.get("startedAt"))
    uptime = _float((runtime or {}).get("uptime"))
    if started is None and uptime is not None:
        started = (time.time() if now is None else now) - uptime
    return Instance(
        provider=PROVIDER,
        instance_id=str(rec.get("id") or instance_id),
        machine_id=None,  # v2 pods do not say which machine they run on
        label=None if rec.get("name") in (None, "") else str(rec["name"]),
        state=state,
        status_line=None if status is None else str(status),
        ssh=ssh if state == "running" else None,
        gpu_util=sum(utils) / len(utils) if utils else None,
        dph_total=_float(rec.get("cost")),
        started_at=started,
        raw=dict(rec),
    )


def _problem(response: httpx.Response) -> str:
    """The vendor's words from a problem+json body (detail and the schema's errors), or the text."""
    data = body_json(response)
    if isinstance(data, dict):
        parts = [str(data.get("detail") or data.get("title") or data.get("message") or "")]
        errors = data.get("errors")
        if isinstance(errors, list) and errors:
            parts.append("; ".join(str(e) for e in errors))
        words = " ".join(p for p in parts if p)
        if words:
            return words
    return body_text(response).strip() or f"HTTP {response.status_code}"


def _retry_after_s(response: httpx.Response) -> float | None:
    value = _float(response.headers.get("Retry-After"))
    return None if value is None or value < 0 else min(value, _RETRY_AFTER_CAP_S)


def _judge(response: httpx.Response) -> Failure | None:
    """RunPod's answer: success, or which of our errors it is."""
    status = response.status_code
    if 200 <= status < 300:
        return None
    vendor = _problem(response)
    low = vendor.lower()
    if status in (401, 403):
        return Failure(AuthFailed, f"the API key was refused (HTTP {status}: {vendor}). Fix: check RUNPOD_API_KEY")
    if status == 402:
        return Failure(
            QuotaExhausted, f"the account has no balance left (HTTP 402: {vendor}). Fix: add funds at runpod.io"
        )
    if status in RETRYABLE_STATUS or status >= 500:
        return Failure(ProviderBusy, f"busy (HTTP {status}: {vendor})", retry_after_s=_retry_after_s(response))
    if status == 400 and any(w in low for w in CAPACITY_WORDS):
        return Failure(OfferGone, f"no capacity left for this offer ({vendor}); pick the next one")
    if status == 410:
        return Failure(
            ProviderError,
            f"this RunPod API is retired (HTTP 410: {vendor}). Fix: unset RUNPOD_API_URL to use {DEFAULT_URL}",
        )
    if status == 422:
        return Failure(ProviderError, f"RunPod refused the request's shape (HTTP 422: {vendor}); not retried")
    return Failure(ProviderError, f"HTTP {status}: {vendor}")


def _judge_allow(*codes: int) -> Translate:
    """For calls where these statuses are answers the caller reads (404 gone, 409 not allowed now)."""

    def judge(response: httpx.Response) -> Failure | None:
        return None if response.status_code in codes else _judge(response)

    return judge


class RunPodMarket:
    """The Market port on RunPod (community cloud; secure cloud for datacenter-only searches)."""

    name = PROVIDER

    def __init__(self, *, api_key: str, api_url: str = DEFAULT_URL, retry: RetryPolicy | None = None) -> None:
        self._url = api_url.rstrip("/")
        self._client = VendorClient(provider=PROVIDER, base_url=self._url, api_key=api_key, retry=retry)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RunPodMarket:
        """Built from RUNPOD_API_KEY and RUNPOD_API_URL; a missing key is a SettingsError naming it."""
        key, url = api_settings(
            env,
            key_var="RUNPOD_API_KEY",
            url_var="RUNPOD_API_URL",
            default_url=DEFAULT_URL,
            key_fix="export RUNPOD_API_KEY=<key from runpod.io, Settings > API Keys>",
        )
        if url.rstrip("/").endswith("/graphql"):
            raise SettingsError(
                "RUNPOD_API_URL", f"{url!r} is the retired GraphQL API", f"unset it to use {DEFAULT_URL}"
            )
        return cls(api_key=key, api_url=url, retry=RetryPolicy.from_env(env))

    def __repr__(self) -> str:
        return f"RunPodMarket(api_url={self._url!r})"

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        translate: Translate = _judge,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> tuple[int, Any]:
        response = self._client.request(
            method, path, json=json, params=params, translate=translate, idempotent=idempotent
        )
        return response.status_code, body_json(response)

    # -- offers --------------------------------------------------------------------------------

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        """GPU types available in the community cloud (secure when datacenter-only), cheapest first."""
        cloud = SECURE if query.datacenter_only else COMMUNITY
        params = {"include": "AVAILABILITY", "product": "POD", "cloud": cloud, "count": str(query.num_gpus)}
        _, data = self._call("GET", "/catalog/gpus", params=params)
        records = data.get("gpus") if isinstance(data, dict) else None
        if not isinstance(records, list):
            raise ProviderError("the GPU catalog answered without a `gpus` list", provider=PROVIDER)
        wanted = {_norm(n) for n in query.gpu_names}
        offers: list[Offer] = []
        for rec in records:
            if not isinstance(rec, Mapping) or rec.get("id") is None:
                continue
            offer = runpod_offer(rec, gpu_count=query.num_gpus, cloud=cloud)
            if offer is None:
                continue
            if wanted and not ({_norm(offer.gpu_name), _norm(offer.offer_id)} & wanted):
                continue
            if query.min_gpu_ram_gb is not None and offer.gpu_ram_gb < query.min_gpu_ram_gb:
                continue
            if query.max_dph is not None and offer.dph_total > query.max_dph:
                continue
            offers.append(offer)
        offers.sort(key=lambda o: o.dph_total)
        return offers[: query.limit]

    # -- lifecycle -----------------------------------------------------------------------------

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        """Create a pod of the offer's GPU type in the offer's cloud, with 22/tcp exposed for SSH."""
        env = dict(spec.env)
        if spec.ssh_public_key.strip():
            env["PUBLIC_KEY"] = spec.ssh_public_key.strip()
        if spec.onstart:
            env["TUNEHARNESS_ONSTART"] = spec.onstart
        cloud = str(offer.raw.get("cloud") or COMMUNITY).upper()
        body: dict[str, Any] = {
            "name": spec.label,
            "image": spec.image,
            "gpu": {"id": offer.offer_id, "count": offer.num_gpus},
            "cloud": SECURE if cloud == SECURE else COMMUNITY,
            "disk": max(1, round(spec.disk_gb)),
            "ports": ["22/tcp"],
            "env": env,
            "startSsh": True,
        }
        _, data = self._call("POST", "/pods", json=body, idempotent=False)
        if not isinstance(data, Mapping) or not data.get("id"):
            raise ProviderError(f"create answered no pod id: {data!r:.200}", provider=PROVIDER)
        return str(data["id"])

    def status(self, instance_id: str) -> Instance:
        code, data = self._call("GET", f"/pods/{instance_id}", translate=_judge_allow(404))
        if code == 404 or not isinstance(data, Mapping):
            return runpod_instance(None, instance_id)
        return runpod_instance(data, instance_id)

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        """Every pod whose name starts with `label_prefix` (RunPod answers all pods at once)."""
        _, data = self._call("GET", "/pods")
        pods = data.get("pods") if isinstance(data, dict) else None
        if not isinstance(pods, list):
            raise ProviderError("the pod list answered without a `pods` list", provider=PROVIDER)
        instances = [runpod_instance(p, str(p.get("id"))) for p in pods if isinstance(p, Mapping)]
        return [i for i in instances if (i.label or "").startswith(label_prefix)]

    def _action(self, instance_id: str, action: str, *, done: tuple[InstanceState, ...]) -> None:
        """POST the action; 409 (not allowed in this status) is fine when the pod is already `done`."""
        code, _ = self._call(
            "POST", f"/pods/{instance_id}/action", json={"action": action}, translate=_judge_allow(404, 409)
        )
        if code == 404:
            raise ProviderError(f"no pod {instance_id} (HTTP 404): it is gone", provider=PROVIDER, status_code=404)
        if code == 409:
            now = self.status(instance_id)
            if now.state == "gone":
                raise ProviderError(f"no pod {instance_id}: it is gone", provider=PROVIDER, status_code=404)
            if now.state not in done:
                raise ProviderError(
                    f"cannot {action} pod {instance_id} while it is {now.status_line} (HTTP 409); "
                    "wait for it to settle and run it again",
                    provider=PROVIDER,
                    status_code=409,
                )

    def stop(self, instance_id: str) -> None:
        """Stop: the container disk is wiped, a volume survives and bills."""
        self._action(instance_id, "stop", done=("stopped", "exited"))

    def start(self, instance_id: str) -> None:
        """Start a stopped pod (it may land on other hardware)."""
        self._action(instance_id, "start", done=("pending", "loading", "running"))

    def destroy(self, instance_id: str) -> None:
        """Terminate; a pod that is already gone is fine."""
        code, _ = self._call(
            "POST",
            f"/pods/{instance_id}/action",
            json={"action": "terminate"},
            translate=_judge_allow(404, 409),
        )
        if code == 409 and self.status(instance_id).state != "gone":
            raise ProviderError(f"RunPod refused to terminate pod {instance_id} (HTTP 409)", provider=PROVIDER)

    # -- price increases -----------------------------------------------------------------------

    def pending_price_increases(self) -> list[PriceIncrease]:
        """RunPod prices do not change under a running pod: there is never one."""
        return []

    def answer_price_increase(self, increase: PriceIncrease, *, accept: bool) -> bool:
        return False


def _norm(name: str) -> str:
    return " ".join(name.replace("_", " ").casefold().split())
