"""`SimClientMarket`: the Market port over HTTP to `tuneharness sim serve`."""

from __future__ import annotations

from typing import Any

import httpx

from app.market import (
    Instance,
    LaunchSpec,
    Offer,
    OfferGone,
    OfferQuery,
    PriceIncrease,
    ProviderBusy,
    ProviderError,
)
from providers.sim.clock import ScaledClock
from providers.sim.wire import (
    instance_from_json,
    offer_from_json,
    offer_to_json,
    query_to_json,
    spec_to_json,
)

__all__ = ["SimClientMarket"]


class SimClientMarket:
    """Talks to one sim server; every process that uses it sees the same marketplace."""

    name = "sim"

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def _call(
        self, method: str, path: str, json: dict[str, Any] | None = None, params: dict[str, str] | None = None
    ) -> Any:
        try:
            r = self._http.request(method, path, json=json, params=params)
        except httpx.TransportError as exc:
            raise ProviderBusy(
                f"sim server at {self.url} unreachable ({type(exc).__name__}). "
                "Fix: start `tuneharness sim serve` or correct TUNEHARNESS_SIM_URL",
                provider=self.name,
            ) from exc
        try:
            body = r.json()
        except ValueError:
            body = {"msg": r.text}
        if r.status_code == 410:
            raise OfferGone(str(body.get("msg")), provider=self.name, status_code=410)
        if r.status_code >= 500:
            raise ProviderBusy(str(body.get("msg")), provider=self.name, status_code=r.status_code)
        if r.status_code >= 400:
            raise ProviderError(str(body.get("msg")), provider=self.name, status_code=r.status_code)
        return body

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = self._call("GET", "/v1/health")
        return body

    def clock(self) -> ScaledClock:
        """The server's simulated clock, readable in this process."""
        c = self.health()["clock"]
        return ScaledClock(scale=float(c["scale"]), epoch_s=float(c["epoch_s"]))

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        body = self._call("POST", "/v1/offers/search", json=query_to_json(query))
        return [offer_from_json(o) for o in body["offers"]]

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        body = self._call("POST", "/v1/instances", json={"offer": offer_to_json(offer), "spec": spec_to_json(spec)})
        return str(body["instance_id"])

    def status(self, instance_id: str) -> Instance:
        return instance_from_json(self._call("GET", f"/v1/instances/{instance_id}"))

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        body = self._call("GET", "/v1/instances", params={"label_prefix": label_prefix})
        return [instance_from_json(i) for i in body["instances"]]

    def stop(self, instance_id: str) -> None:
        self._call("POST", f"/v1/instances/{instance_id}/stop")

    def start(self, instance_id: str) -> None:
        self._call("POST", f"/v1/instances/{instance_id}/start")

    def destroy(self, instance_id: str) -> None:
        self._call("DELETE", f"/v1/instances/{instance_id}")

    def pending_price_increases(self) -> list[PriceIncrease]:
        """The simulated hosts never raise their price."""
        return []

    def answer_price_increase(self, increase: PriceIncrease, *, accept: bool) -> bool:
        return False

    def referee_bills(self) -> list[dict[str, Any]]:
        """The simulator's own billing from truth (for the demo's receipt, never for policy)."""
        body = self._call("GET", "/v1/referee/bills")
        return list(body["bills"])

    def referee_truth(self, instance_id: str) -> dict[str, Any]:
        """The host's truth (for the simulator's referee and tests, never for policy)."""
        body: dict[str, Any] = self._call("GET", f"/v1/referee/truth/{instance_id}")
        return body

    def close(self) -> None:
        self._http.close()
