"""RunPod adapter: the GraphQL API, spoken with httpx and `variables` (no vendor SDK).

Quirks handled here (see ../shared/reference/providers.md):
- errors come back as HTTP 200 with `{"errors": [{"message": ...}]}`;
- a pod is ready only when `runtime` is non-null AND lists a public 22/tcp port: until then it is
  `loading`, whatever `desiredStatus` (intent, not readiness) says;
- GPU prices are per GPU per hour: an offer's `dph_total` is the price times its GPU count;
- the capacity error ("There are no longer any instances available ...") means the offer is gone;
- pods carry our label in their `name`; `desiredStatus` RUNNING / EXITED / TERMINATED map to
  running-or-loading / stopped / gone.

RunPod sells GPU types, not machines: an offer is (GPU type, count) in the community cloud, its
`offer_id` is the GPU type id and `machine_id` is None (the vendor shows the machine only after
create). RunPod has no onstart hook: `LaunchSpec.onstart` travels as the env variable
TUNEHARNESS_ONSTART and the harness runs it over SSH; the SSH key travels as PUBLIC_KEY, which
RunPod's images install for root.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx

from app.market import (
    AuthFailed,
    Instance,
    InstanceState,
    LaunchSpec,
    Offer,
    OfferGone,
    OfferQuery,
    ProviderBusy,
    ProviderError,
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

__all__ = ["CAPACITY_ERROR", "DEFAULT_URL", "RunPodMarket", "runpod_instance", "runpod_offer"]

DEFAULT_URL = "https://api.runpod.io/graphql"
PROVIDER = "runpod"
CAPACITY_ERROR = "There are no longer any instances available with the requested specifications"

POD_FIELDS = (
    "id name desiredStatus lastStatusChange costPerHr gpuCount machineId imageName "
    "runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } "
    "gpus { id gpuUtilPercent } }"
)

Q_GPU_TYPES = (
    "query GpuTypes($gpuCount: Int!) { gpuTypes { id displayName memoryInGb securePrice "
    "communityPrice lowestPrice(input: {gpuCount: $gpuCount}) { minimumBidPrice "
    "uninterruptablePrice stockStatus } } }"
)
M_DEPLOY = (
    "mutation Deploy($input: PodFindAndDeployOnDemandInput!) { podFindAndDeployOnDemand(input: $input) "
    "{ id desiredStatus machineId machine { podHostId } } }"
)
Q_POD = f"query Pod($podId: String!) {{ pod(input: {{podId: $podId}}) {{ {POD_FIELDS} }} }}"
Q_PODS = f"query Pods {{ myself {{ pods {{ {POD_FIELDS} }} }} }}"
M_STOP = "mutation Stop($podId: String!) { podStop(input: {podId: $podId}) { id desiredStatus } }"
M_RESUME = (
    "mutation Resume($podId: String!, $gpuCount: Int!) "
    "{ podResume(input: {podId: $podId, gpuCount: $gpuCount}) { id desiredStatus } }"
)
M_TERMINATE = "mutation Terminate($podId: String!) { podTerminate(input: {podId: $podId}) }"

_GONE_WORDS = ("not found", "does not exist", "no pod")


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def runpod_offer(rec: Mapping[str, Any], *, gpu_count: int) -> Offer | None:
    """A `gpuTypes` record as a community-cloud Offer for `gpu_count` GPUs; None when unrentable."""
    per_gpu = _float(rec.get("communityPrice"))
    lowest = rec.get("lowestPrice") if isinstance(rec.get("lowestPrice"), Mapping) else {}
    if per_gpu is None or per_gpu <= 0 or not (lowest or {}).get("stockStatus"):
        return None
    return Offer(
        provider=PROVIDER,
        offer_id=str(rec["id"]),
        machine_id=None,
        gpu_name=str(rec.get("displayName") or rec["id"]),
        num_gpus=gpu_count,
        gpu_ram_gb=_float(rec.get("memoryInGb")) or 0.0,
        dph_total=round(per_gpu * gpu_count, 6),  # prices are per GPU
        storage_per_gb_month=None,  # not in the API: unknown, flagged by the pricing
        inet_down_per_gb=None,
        inet_down_mbps=None,
        reliability=None,
        cuda_max=None,
        raw=dict(rec),
    )


def _public_ssh(runtime: Mapping[str, Any] | None) -> SSHEndpoint | None:
    if not runtime:
        return None
    for port in runtime.get("ports") or []:
        if (
            isinstance(port, Mapping)
            and port.get("privatePort") == 22
            and port.get("isIpPublic")
            and str(port.get("type") or "tcp").lower() == "tcp"
            and port.get("ip")
            and port.get("publicPort") is not None
        ):
            try:
                return SSHEndpoint(host=str(port["ip"]), port=int(port["publicPort"]))
            except (TypeError, ValueError):
                continue
    return None


def _state(desired: Any, ssh: SSHEndpoint | None) -> InstanceState:
    if desired == "RUNNING":
        return "running" if ssh is not None else "loading"
    if desired == "EXITED":
        return "stopped"
    if desired == "TERMINATED":
        return "gone"
    if desired == "CREATED":
        return "pending"
    if desired == "DEAD":
        return "exited"
    return "unknown"


def runpod_instance(rec: Mapping[str, Any] | None, instance_id: str, *, now: float | None = None) -> Instance:
    """A `pod` record as an Instance; `None` (RunPod's answer for an unknown pod) reads as gone."""
    if rec is None:
        return Instance.gone(PROVIDER, instance_id)
    runtime = rec.get("runtime") if isinstance(rec.get("runtime"), Mapping) else None
    ssh = _public_ssh(runtime)
    state = _state(rec.get("desiredStatus"), ssh)
    utils = [
        u
        for u in (_float(g.get("gpuUtilPercent")) for g in (runtime or {}).get("gpus") or [] if isinstance(g, Mapping))
        if u is not None
    ]
    uptime = _float((runtime or {}).get("uptimeInSeconds"))
    status = rec.get("lastStatusChange")
    return Instance(
        provider=PROVIDER,
        instance_id=str(rec.get("id") or instance_id),
        machine_id=None if rec.get("machineId") in (None, "") else str(rec["machineId"]),
        label=None if rec.get("name") in (None, "") else str(rec["name"]),
        state=state,
        status_line=None if status is None else str(status),
        ssh=ssh if state == "running" else None,
        gpu_util=sum(utils) / len(utils) if utils else None,
        dph_total=_float(rec.get("costPerHr")),
        started_at=None if uptime is None else (time.time() if now is None else now) - uptime,
        raw=dict(rec),
    )


def _messages(data: Any) -> list[str]:
    errors = data.get("errors") if isinstance(data, dict) else None
    if not errors:
        return []
    if not isinstance(errors, list):
        return [str(errors)]
    return [str(e.get("message") if isinstance(e, Mapping) else e) for e in errors]


def _judge(response: httpx.Response) -> Failure | None:
    """RunPod's answer: success, or which of our errors it is (errors hide inside HTTP 200)."""
    status = response.status_code
    data = body_json(response)
    messages = _messages(data)
    vendor = "; ".join(messages) or body_text(response).strip() or f"HTTP {status}"
    low = vendor.lower()
    if status in (401, 403) or (
        messages and any(w in low for w in ("unauthorized", "unauthenticated", "invalid api key"))
    ):
        return Failure(AuthFailed, f"the API key was refused ({vendor}). Fix: check RUNPOD_API_KEY")
    if status in RETRYABLE_STATUS or (messages and ("rate limit" in low or "too many requests" in low)):
        return Failure(ProviderBusy, f"busy (HTTP {status}: {vendor})")
    if status != 200:
        return Failure(ProviderError, f"HTTP {status}: {vendor}")
    if not isinstance(data, dict):
        return Failure(ProviderError, f"answered something that is not a GraphQL response: {vendor}")
    if messages:
        if CAPACITY_ERROR.lower() in low or "no longer any instances available" in low:
            return Failure(OfferGone, f"no capacity left for this offer ({vendor}); pick the next one")
        return Failure(ProviderError, vendor)
    return None


def _judge_gone_ok(response: httpx.Response) -> Failure | None:
    """For terminate: a pod RunPod no longer knows is already what we wanted."""
    failure = _judge(response)
    if (
        failure is not None
        and failure.error is ProviderError
        and any(w in failure.message.lower() for w in _GONE_WORDS)
    ):
        return None
    return failure


class RunPodMarket:
    """The Market port on RunPod's community cloud."""

    name = PROVIDER

    def __init__(self, *, api_key: str, api_url: str = DEFAULT_URL, retry: RetryPolicy | None = None) -> None:
        self._url = api_url
        self._client = VendorClient(provider=PROVIDER, base_url=api_url, api_key=api_key, retry=retry)

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
        return cls(api_key=key, api_url=url, retry=RetryPolicy.from_env(env))

    def __repr__(self) -> str:
        return f"RunPodMarket(api_url={self._url!r})"

    def close(self) -> None:
        self._client.close()

    def _graphql(
        self,
        query: str,
        variables: Mapping[str, Any] | None = None,
        *,
        translate: Translate = _judge,
        idempotent: bool = True,
    ) -> dict[str, Any]:
        response = self._client.request(
            "POST",
            self._url,
            json={"query": query, "variables": dict(variables or {})},
            translate=translate,
            idempotent=idempotent,
        )
        data = body_json(response)
        payload = data.get("data") if isinstance(data, dict) else None
        return payload if isinstance(payload, dict) else {}

    # -- offers --------------------------------------------------------------------------------

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        """Community-cloud GPU types in stock, cheapest first, filtered here (RunPod has no filters)."""
        data = self._graphql(Q_GPU_TYPES, {"gpuCount": query.num_gpus})
        records = data.get("gpuTypes")
        if not isinstance(records, list):
            raise ProviderError("gpuTypes answered without a list", provider=PROVIDER)
        wanted = {_norm(n) for n in query.gpu_names}
        offers: list[Offer] = []
        for rec in records:
            if not isinstance(rec, Mapping) or rec.get("id") is None:
                continue
            offer = runpod_offer(rec, gpu_count=query.num_gpus)
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
        """Deploy a community pod of the offer's GPU type; OfferGone when capacity ran out."""
        env = [{"key": k, "value": v} for k, v in spec.env.items()]
        if spec.ssh_public_key.strip():
            env.append({"key": "PUBLIC_KEY", "value": spec.ssh_public_key.strip()})
        if spec.onstart:
            env.append({"key": "TUNEHARNESS_ONSTART", "value": spec.onstart})
        deploy = {
            "name": spec.label,
            "imageName": spec.image,
            "cloudType": "COMMUNITY",
            "gpuTypeId": offer.offer_id,
            "gpuCount": offer.num_gpus,
            "containerDiskInGb": round(spec.disk_gb),
            "volumeInGb": 0,
            "ports": "22/tcp",
            "env": env,
            "supportPublicIp": True,
            "startSsh": True,
        }
        data = self._graphql(M_DEPLOY, {"input": deploy}, idempotent=False)
        pod = data.get("podFindAndDeployOnDemand")
        if not isinstance(pod, Mapping) or not pod.get("id"):
            raise OfferGone("deploy answered no pod: no capacity for this offer", provider=PROVIDER)
        return str(pod["id"])

    def status(self, instance_id: str) -> Instance:
        data = self._graphql(Q_POD, {"podId": instance_id}, translate=_judge_gone_ok)
        pod = data.get("pod")
        return runpod_instance(pod if isinstance(pod, Mapping) else None, instance_id)

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        """Every pod whose name starts with `label_prefix` (RunPod answers all pods at once)."""
        data = self._graphql(Q_PODS)
        myself = data.get("myself")
        pods = myself.get("pods") if isinstance(myself, Mapping) else None
        if not isinstance(pods, list):
            raise ProviderError("myself.pods answered without a list", provider=PROVIDER)
        instances = [runpod_instance(p, str(p.get("id"))) for p in pods if isinstance(p, Mapping)]
        return [i for i in instances if (i.label or "").startswith(label_prefix)]

    def stop(self, instance_id: str) -> None:
        """Stop: the container disk is wiped, a volume survives and bills."""
        data = self._graphql(M_STOP, {"podId": instance_id})
        if data.get("podStop") is None:
            raise ProviderError(f"no pod {instance_id}: it is gone", provider=PROVIDER, status_code=404)

    def start(self, instance_id: str) -> None:
        """Resume with the pod's GPU count (it may land on other hardware)."""
        current = self.status(instance_id)
        if current.state == "gone":
            raise ProviderError(f"no pod {instance_id}: it is gone", provider=PROVIDER, status_code=404)
        gpu_count = int(current.raw.get("gpuCount") or 1)
        self._graphql(M_RESUME, {"podId": instance_id, "gpuCount": gpu_count})

    def destroy(self, instance_id: str) -> None:
        """Terminate; a pod that is already gone is fine."""
        self._graphql(M_TERMINATE, {"podId": instance_id}, translate=_judge_gone_ok)


def _norm(name: str) -> str:
    return " ".join(name.replace("_", " ").casefold().split())
