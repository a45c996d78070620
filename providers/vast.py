"""Vast.ai adapter: the REST API, spoken with httpx (no vendor SDK).

The instance list is `GET /api/v1/instances/` (the v0 list answers 410 Gone); everything else
stays on `/api/v0` (see ../shared/reference/providers-2026.md). Quirks handled here:
- the v1 list pages by at most 25 rows behind an opaque `next_token`; query values travel as
  JSON text, as vast-cli sends them. A listing counts only when the rows gathered equal
  `total_instances`: a reconciler must never act on part of the fleet;
- one instance comes back as ONE object under the plural key `instances`, and `null` (or a
  404) once it is gone: both read as state `gone`;
- `ports["22/tcp"][0]["HostPort"]` is a string; direct SSH (`public_ipaddr:HostPort`) is
  preferred, the proxy (`ssh_host:ssh_port`) is kept as the fallback endpoint;
- `gpu_ram` is in MB (Vast's own tools divide by 1000), our offers say GB;
- 429 bodies are plain text or JSON; `search_quota_exceeded` is a daily quota and is not
  retried; 401 is a refused key; `no_such_ask` (or 404/410 on create) means the offer is gone;
- a host may ask a higher price for a running contract: pending increases are listed and
  answered one by one (body exactly `{"pending_price_increase_id": n}`; a stale one is 404
  `no_pending_price_increase`, or 409 on older backends).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote_plus

import httpx

from app.market import (
    AuthFailed,
    Instance,
    InstanceState,
    LaunchSpec,
    MarketError,
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

__all__ = [
    "DEFAULT_URL",
    "LIST_PAGE_ROWS",
    "VastMarket",
    "vast_gpu_ram_gb",
    "vast_instance",
    "vast_offer",
    "vast_price_increase",
]

log = logging.getLogger(__name__)

DEFAULT_URL = "https://console.vast.ai"
PROVIDER = "vast"
_MB_PER_GB = 1000.0  # Vast's CLI shows gpu_ram / 1000 and multiplies GB filters by 1000
_S_PER_HOUR = 3600.0
LIST_PAGE_ROWS = 25  # the v1 list's largest page
_LIST_ORDER = [{"col": "id", "dir": "asc"}]
_MAX_LIST_PAGES = 10_000  # a token that never ends is a vendor bug, not a fleet
_STALE_INCREASE = "no_pending_price_increase"

# The SDK's default filters: only verified, datacenter-or-not, rentable offers nobody holds.
_DEFAULT_FILTERS: dict[str, dict[str, Any]] = {
    "verified": {"eq": True},
    "external": {"eq": False},
    "rentable": {"eq": True},
    "rented": {"eq": False},
}


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None  # a vendor's NaN or infinity is no number


def _str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def vast_gpu_ram_gb(gpu_ram_mb: Any) -> float:
    """Vast's per-GPU `gpu_ram` (MB) in GB, as Vast's own tools show it."""
    mb = _float(gpu_ram_mb)
    return 0.0 if mb is None else round(mb / _MB_PER_GB, 2)


def vast_offer(rec: Mapping[str, Any]) -> Offer:
    """One record of `/bundles/` as an Offer. Raises KeyError/ValueError on a malformed one."""
    reliability = _float(rec.get("reliability2"))
    if reliability is None:
        reliability = _float(rec.get("reliability"))
    dph_total = _float(rec.get("dph_total"))
    if dph_total is None or dph_total < 0:
        raise ValueError(f"offer has no finite, non-negative dph_total ({rec.get('dph_total')!r})")
    return Offer(
        provider=PROVIDER,
        offer_id=str(rec["id"]),
        machine_id=_str(rec.get("machine_id")),
        gpu_name=str(rec.get("gpu_name") or "unknown"),
        num_gpus=int(rec.get("num_gpus") or 1),
        gpu_ram_gb=vast_gpu_ram_gb(rec.get("gpu_ram")),
        dph_total=dph_total,
        storage_per_gb_month=_float(rec.get("storage_cost")),
        inet_down_per_gb=_float(rec.get("inet_down_cost")),
        inet_down_mbps=_float(rec.get("inet_down")),
        reliability=reliability,
        cuda_max=_str(rec.get("cuda_max_good")),
        raw=dict(rec),
    )


def _state(rec: Mapping[str, Any]) -> InstanceState:
    actual = rec.get("actual_status")
    stopping = rec.get("intended_status") == "stopped" or rec.get("cur_state") == "stopped"
    if actual == "running":
        return "running"
    if actual in ("loading", "rebooting"):
        return "loading"
    if actual in (None, "created"):
        return "stopped" if stopping else "pending"
    if actual in ("stopped", "frozen"):
        return "stopped"
    if actual == "exited":
        return "stopped" if stopping else "exited"
    return "unknown"  # "unknown", "offline" and anything new


def _direct_ssh(rec: Mapping[str, Any]) -> SSHEndpoint | None:
    ip = _str(rec.get("public_ipaddr"))
    ports = rec.get("ports") or {}
    entries = ports.get("22/tcp") if isinstance(ports, Mapping) else None
    if ip and isinstance(entries, list):
        for entry in entries:
            try:
                port = int(str(entry.get("HostPort")))  # a STRING in Vast's answers
            except (AttributeError, TypeError, ValueError):
                continue
            return SSHEndpoint(host=ip.strip(), port=port)
    return None


def _proxy_ssh(rec: Mapping[str, Any]) -> SSHEndpoint | None:
    host, port_raw = _str(rec.get("ssh_host")), rec.get("ssh_port")
    if host and port_raw is not None:
        try:
            return SSHEndpoint(host=host, port=int(str(port_raw)))
        except ValueError:
            return None
    return None


def _ssh(rec: Mapping[str, Any]) -> tuple[SSHEndpoint | None, SSHEndpoint | None]:
    """(the endpoint to try first, the fallback): direct then proxy, or the proxy alone."""
    direct, proxy = _direct_ssh(rec), _proxy_ssh(rec)
    if direct is None:
        return proxy, None
    return direct, (proxy if proxy != direct else None)


def vast_instance(rec: Mapping[str, Any] | None, instance_id: str) -> Instance:
    """One record of `/instances/` as an Instance; `None` (Vast's "gone") reads as state gone."""
    if rec is None:
        return Instance.gone(PROVIDER, instance_id)
    state = _state(rec)
    status_msg = rec.get("status_msg")
    ssh, fallback = _ssh(rec) if state == "running" else (None, None)
    return Instance(
        provider=PROVIDER,
        instance_id=str(rec.get("id", instance_id)),
        machine_id=_str(rec.get("machine_id")),
        label=_str(rec.get("label")),
        state=state,
        status_line=None if status_msg is None else str(status_msg),
        ssh=ssh,
        gpu_util=_float(rec.get("gpu_util")),
        dph_total=_float(rec.get("dph_total")),
        started_at=_float(rec.get("start_date")),
        raw=dict(rec),
        ssh_fallback=fallback,
    )


def _all_in_per_hour(rec: Mapping[str, Any], side: str) -> float | None:
    """One side (`old`/`new`) of an increase as all-in $/h: (GPU + disk/RAM per second) * 3600,
    plus the platform fee as a fraction. A `new_` field left null is unchanged: the `old_` one stands."""

    def rate(name: str) -> float | None:
        value = _float(rec.get(f"{side}_{name}"))
        return _float(rec.get(f"old_{name}")) if value is None else value

    gpu = rate("gpu_costpersec")
    if gpu is None:
        return None
    disk = rate("disk_ram_costpersec") or 0.0
    fee = rate("platform_fee") or 0.0
    return round((gpu + disk) * _S_PER_HOUR * (1.0 + fee), 6)


def vast_price_increase(rec: Mapping[str, Any]) -> PriceIncrease:
    """One row of `/instances/pending-price-increases/`. Raises KeyError/ValueError on a malformed one."""
    return PriceIncrease(
        provider=PROVIDER,
        increase_id=str(int(rec["pending_price_increase_id"])),
        instance_id=str(int(rec["contract_id"])),
        old_dph_total=_all_in_per_hour(rec, "old"),
        new_dph_total=_all_in_per_hour(rec, "new"),
        starts_at=_float(rec.get("contract_end_date")),
        raw=dict(rec),
    )


def _judge(response: httpx.Response) -> Failure | None:
    """Vast's answer: success, or which of our errors it is."""
    status = response.status_code
    data = body_json(response)
    text = body_text(response)
    error = msg = ""
    if isinstance(data, dict):
        error = str(data.get("error") or "")
        msg = str(data.get("msg") or data.get("detail") or data.get("message") or "")
        if 200 <= status < 300 and data.get("success") is not False:
            return None
    elif 200 <= status < 300:
        if data is not None:
            return None  # a JSON list or scalar: the caller decides
        return Failure(ProviderError, f"answered HTTP {status} with something that is not JSON: {text}")
    vendor = f"{error}: {msg}" if error and msg else (error or msg or text.strip() or f"HTTP {status}")
    if "search_quota_exceeded" in error or "search_quota_exceeded" in text:
        return Failure(
            QuotaExhausted,
            f"the daily search quota is used up ({vendor}); not retried. Fix: wait for the quota "
            "to reset (daily) or search less often",
        )
    if status == 401 or error == "auth_error":  # some accounts get a 404 with auth_error for a bad key
        return Failure(AuthFailed, f"the API key was refused (HTTP {status}: {vendor}). Fix: check VAST_API_KEY")
    if status in RETRYABLE_STATUS or error == "rate_limit_exceeded":
        return Failure(ProviderBusy, f"busy (HTTP {status}: {vendor})")
    if error == "no_such_ask":
        return Failure(OfferGone, f"the offer is gone ({vendor}); pick the next one")
    return Failure(ProviderError, f"HTTP {status}: {vendor}")


def _judge_create(response: httpx.Response) -> Failure | None:
    failure = _judge(response)
    if failure is not None and failure.error is ProviderError and response.status_code in (404, 410):
        return Failure(OfferGone, f"the offer is gone (HTTP {response.status_code}); pick the next one")
    return failure


def _judge_allow_404(response: httpx.Response) -> Failure | None:
    """For calls where 404 means 'already gone' (status, destroy): the caller reads the status.
    A 404 that says `auth_error` is a refused key, never a gone instance."""
    if response.status_code == 404 and not _is_auth_error(response):
        return None
    return _judge(response)


def _is_auth_error(response: httpx.Response) -> bool:
    data = body_json(response)
    return isinstance(data, dict) and data.get("error") == "auth_error"


def _judge_answer(response: httpx.Response) -> Failure | None:
    """For a price-increase answer: stale (404 `no_pending_price_increase`, or 409) is not a failure."""
    if response.status_code == 409:
        return None
    if response.status_code == 404:
        data = body_json(response)
        if isinstance(data, dict) and data.get("error") == _STALE_INCREASE:
            return None
    return _judge(response)


def _list_query(params: Mapping[str, Any]) -> str:
    """The v1 list's query as vast-cli writes it: JSON text for non-strings, then quote_plus."""
    return "&".join(f"{k}={quote_plus(v if isinstance(v, str) else json.dumps(v))}" for k, v in params.items())


class VastMarket:
    """The Market port on Vast.ai."""

    name = PROVIDER

    def __init__(self, *, api_key: str, api_url: str = DEFAULT_URL, retry: RetryPolicy | None = None) -> None:
        self._client = VendorClient(provider=PROVIDER, base_url=api_url, api_key=api_key, retry=retry)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> VastMarket:
        """Built from VAST_API_KEY and VAST_API_URL; a missing key is a SettingsError naming it."""
        key, url = api_settings(
            env,
            key_var="VAST_API_KEY",
            url_var="VAST_API_URL",
            default_url=DEFAULT_URL,
            key_fix="export VAST_API_KEY=<key from console.vast.ai, Account > API Keys>",
        )
        return cls(api_key=key, api_url=url, retry=RetryPolicy.from_env(env))

    def __repr__(self) -> str:
        return f"VastMarket(api_url={self._client.base_url!r})"

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
        """Rentable on-demand offers, cheapest first; filters pushed to Vast and checked again here."""
        body: dict[str, Any] = dict(_DEFAULT_FILTERS)
        body["num_gpus"] = {"eq": query.num_gpus}
        names = [_gpu_name(n) for n in query.gpu_names]
        if len(names) == 1:
            body["gpu_name"] = {"eq": names[0]}
        elif names:
            body["gpu_name"] = {"in": names}
        if query.min_gpu_ram_gb is not None:
            body["gpu_ram"] = {"gte": query.min_gpu_ram_gb * _MB_PER_GB}
        if query.max_dph is not None:
            body["dph_total"] = {"lte": query.max_dph}
        if query.disk_gb > 0:
            body["disk_space"] = {"gte": query.disk_gb}
            body["allocated_storage"] = query.disk_gb
        if query.datacenter_only:
            body["datacenter"] = {"eq": True}  # vast-cli's field; the server reads hosting_type == 1
        body.update(order=[["dph_total", "asc"]], type="on-demand", limit=query.limit)
        _, data = self._call("POST", "/api/v0/bundles/", json=body)
        records = data.get("offers") if isinstance(data, dict) else None
        if not isinstance(records, list):
            raise ProviderError("search answered without an `offers` list", provider=PROVIDER)
        wanted = {n.casefold() for n in names}
        offers: list[Offer] = []
        for rec in records:
            try:
                offer = vast_offer(rec)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("vast: skipping a malformed offer (%s)", exc)
                continue
            if wanted and offer.gpu_name.casefold() not in wanted:
                continue
            if query.min_gpu_ram_gb is not None and offer.gpu_ram_gb < query.min_gpu_ram_gb:
                continue
            if query.max_dph is not None and offer.dph_total > query.max_dph:
                continue
            if offer.num_gpus != query.num_gpus:
                continue
            if query.datacenter_only and rec.get("hosting_type") not in (1, True):
                continue
            offers.append(offer)
        offers.sort(key=lambda o: o.dph_total)
        return offers[: query.limit]

    # -- lifecycle -----------------------------------------------------------------------------

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        """Accept the ask; attach the job's SSH key. Raises OfferGone when someone was quicker."""
        body: dict[str, Any] = {
            "client_id": "me",
            "image": spec.image,
            "disk": spec.disk_gb,
            "env": dict(spec.env),
            "onstart": spec.onstart,
            "runtype": "ssh_direc ssh_proxy",
            "label": spec.label,
            "cancel_unavail": True,
        }
        _, data = self._call(
            "PUT", f"/api/v0/asks/{offer.offer_id}/", json=body, translate=_judge_create, idempotent=False
        )
        contract = data.get("new_contract") if isinstance(data, dict) else None
        if contract is None:
            raise ProviderError(f"create answered without `new_contract`: {data!r:.200}", provider=PROVIDER)
        instance_id = str(contract)
        if spec.ssh_public_key.strip():
            # The instance exists and bills from here on: never lose its id to a failed key upload.
            # Vast also installs the account's keys; without ours, SSH preflight fails and the
            # instance is destroyed as a failed boot, with its create on the ledger.
            try:
                self._call(
                    "POST", f"/api/v0/instances/{instance_id}/ssh/", json={"ssh_key": spec.ssh_public_key.strip()}
                )
            except MarketError as exc:
                log.warning("vast: instance %s created, but attaching the SSH key failed: %s", instance_id, exc)
        return instance_id

    def status(self, instance_id: str) -> Instance:
        code, data = self._call(
            "GET", f"/api/v0/instances/{instance_id}/", params={"owner": "me"}, translate=_judge_allow_404
        )
        if code == 404 or not isinstance(data, dict):
            return vast_instance(None, instance_id)
        rec = data.get("instances")
        if isinstance(rec, list):  # tolerate the list shape some API versions answer
            rec = next((r for r in rec if str(r.get("id")) == instance_id), None)
        return vast_instance(rec if isinstance(rec, dict) else None, instance_id)

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        """Every instance of the account whose label starts with `label_prefix`, all v1 pages.

        Raises ProviderError when the pages do not add up to `total_instances`: acting on part of
        the fleet (stopping what looks unknown, missing what bills) is worse than not acting.
        """
        params: dict[str, Any] = {"select_filters": {}, "order_by": _LIST_ORDER, "limit": LIST_PAGE_ROWS}
        records: list[dict[str, Any]] = []
        total: Any = None
        seen: set[str] = set()
        for _ in range(_MAX_LIST_PAGES):
            _, data = self._call("GET", f"/api/v1/instances/?{_list_query(params)}")
            page = data.get("instances") if isinstance(data, dict) else None
            if not isinstance(data, dict) or not isinstance(page, list):
                raise ProviderError("the instance list answered without an `instances` list", provider=PROVIDER)
            records.extend(r for r in page if isinstance(r, dict))
            total = data.get("total_instances")
            token = data.get("next_token")
            if not token:
                break
            if str(token) in seen:
                raise ProviderError(
                    f"the instance list repeated a page token after {len(records)} rows", provider=PROVIDER
                )
            seen.add(str(token))
            params["after_token"] = str(token)
        else:
            raise ProviderError(f"the instance list did not end after {_MAX_LIST_PAGES} pages", provider=PROVIDER)
        if isinstance(total, bool) or not isinstance(total, int) or total != len(records):
            raise ProviderError(
                f"the instance list is incomplete: {len(records)} rows gathered but total_instances "
                f"is {total!r}; nothing was acted on. Run it again",
                provider=PROVIDER,
            )
        instances = [vast_instance(r, str(r.get("id"))) for r in records]
        return [i for i in instances if (i.label or "").startswith(label_prefix)]

    def _set_state(self, instance_id: str, state: str) -> None:
        code, _ = self._call(
            "PUT", f"/api/v0/instances/{instance_id}/", json={"state": state}, translate=_judge_allow_404
        )
        if code == 404:
            raise ProviderError(f"no instance {instance_id} (HTTP 404): it is gone", provider=PROVIDER, status_code=404)

    def stop(self, instance_id: str) -> None:
        """Stop: GPU billing ends, storage keeps billing until destroy."""
        self._set_state(instance_id, "stopped")

    def start(self, instance_id: str) -> None:
        self._set_state(instance_id, "running")

    def destroy(self, instance_id: str) -> None:
        """Destroy; already gone (404) is fine."""
        self._call("DELETE", f"/api/v0/instances/{instance_id}/", translate=_judge_allow_404)

    # -- price increases -----------------------------------------------------------------------

    def pending_price_increases(self) -> list[PriceIncrease]:
        """The increases hosts asked of our instances and nobody answered yet."""
        _, data = self._call("GET", "/api/v0/instances/pending-price-increases/")
        rows = data.get("pending_price_increases") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise ProviderError("pending price increases answered without a list", provider=PROVIDER)
        if isinstance(data, dict) and data.get("truncated"):
            log.warning("vast: the pending price increases were truncated at %d rows", len(rows))
        increases: list[PriceIncrease] = []
        for rec in rows:
            try:
                increases.append(vast_price_increase(rec))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("vast: skipping a malformed price increase (%s)", exc)
        return increases

    def answer_price_increase(self, increase: PriceIncrease, *, accept: bool) -> bool:
        """Accept or reject one increase; False when Vast says it is no longer pending."""
        verb = "accept" if accept else "reject"
        code, _ = self._call(
            "PUT",
            f"/api/v0/instances/{verb}-price-increase/",
            json={"pending_price_increase_id": int(increase.increase_id)},
            translate=_judge_answer,
        )
        return code not in (404, 409)


def _gpu_name(name: str) -> str:
    """Vast names GPUs with spaces ("RTX 4090"); accept the CLI's underscores too."""
    return " ".join(name.replace("_", " ").split())
