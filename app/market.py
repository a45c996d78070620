"""The Market port: the one seam through which every marketplace is rented.

Domain types are normalized and frozen; the policy layer sees only these, never a vendor's
record (kept in `raw` for the operator's eyes). Adapters live in `providers/` and translate
every vendor error into the hierarchy below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, runtime_checkable

from app.errors import TuneharnessError

__all__ = [
    "INSTANCE_STATES",
    "OFFER_FIELDS",
    "AuthFailed",
    "CreateUnconfirmed",
    "Instance",
    "InstanceState",
    "LaunchSpec",
    "Market",
    "MarketError",
    "Offer",
    "OfferGone",
    "OfferQuery",
    "PriceIncrease",
    "ProviderBusy",
    "ProviderError",
    "QuotaExhausted",
    "SSHEndpoint",
]

InstanceState = Literal["pending", "loading", "running", "stopped", "exited", "gone", "unknown"]
INSTANCE_STATES: tuple[str, ...] = ("pending", "loading", "running", "stopped", "exited", "gone", "unknown")


@dataclass(frozen=True, slots=True)
class Offer:
    """Something rentable, as the marketplace describes it (which may be a lie)."""

    provider: str
    offer_id: str
    machine_id: str | None
    gpu_name: str
    num_gpus: int
    gpu_ram_gb: float  # per GPU
    dph_total: float  # $/h for all GPUs
    storage_per_gb_month: float | None
    inet_down_per_gb: float | None
    inet_down_mbps: float | None
    reliability: float | None
    cuda_max: str | None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


# An offer's described fields, in order: everything but the vendor's raw record.
OFFER_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Offer) if f.name != "raw")


@dataclass(frozen=True, slots=True)
class SSHEndpoint:
    host: str
    port: int
    user: str = "root"


@dataclass(frozen=True, slots=True)
class Instance:
    """A rented instance as the provider reports it right now."""

    provider: str
    instance_id: str
    machine_id: str | None
    label: str | None
    state: InstanceState
    status_line: str | None  # the vendor's boot/status message, verbatim
    ssh: SSHEndpoint | None
    gpu_util: float | None  # percent, None when unknown
    dph_total: float | None
    started_at: float | None  # epoch seconds
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    # A second way in (Vast's SSH proxy beside the direct port): tried when `ssh` refuses or times out.
    ssh_fallback: SSHEndpoint | None = None

    @classmethod
    def gone(cls, provider: str, instance_id: str) -> Instance:
        """An instance the vendor no longer knows: nothing about it but its id."""
        return cls(
            provider=provider,
            instance_id=instance_id,
            machine_id=None,
            label=None,
            state="gone",
            status_line=None,
            ssh=None,
            gpu_util=None,
            dph_total=None,
            started_at=None,
        )


@dataclass(frozen=True, slots=True)
class OfferQuery:
    """What to search for; adapters push what they can to the vendor and filter the rest."""

    gpu_names: Sequence[str] = ()
    min_gpu_ram_gb: float | None = None
    num_gpus: int = 1
    max_dph: float | None = None
    disk_gb: float = 0.0
    limit: int = 64
    datacenter_only: bool = False  # Vast's datacenter hosts, RunPod's secure cloud


@dataclass(frozen=True, slots=True)
class PriceIncrease:
    """A host's pending price increase on one of our instances, awaiting our answer.

    Prices are all-in $/h (GPU + storage, as the vendor's per-second rates say); None when the
    vendor's record does not tell.
    """

    provider: str
    increase_id: str
    instance_id: str
    old_dph_total: float | None
    new_dph_total: float | None
    starts_at: float | None  # epoch seconds: when the new price would apply
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How to start an instance. Never holds a secret: `env` reaches a stranger's machine."""

    image: str
    disk_gb: float
    label: str
    ssh_public_key: str
    env: Mapping[str, str] = field(default_factory=dict)
    onstart: str = ""


@runtime_checkable
class Market(Protocol):
    """Search, create, observe, stop, start and destroy instances at one provider."""

    name: str

    def search_offers(self, query: OfferQuery) -> list[Offer]: ...

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        """Rent `offer`; return the new instance id. Raises OfferGone if it was taken."""
        ...

    def status(self, instance_id: str) -> Instance:
        """The instance now; state `gone` when the provider no longer has it."""
        ...

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        """Every instance whose label starts with `label_prefix`, all pages."""
        ...

    def stop(self, instance_id: str) -> None: ...

    def start(self, instance_id: str) -> None: ...

    def destroy(self, instance_id: str) -> None:
        """Destroy; an instance that is already gone is not an error."""
        ...

    def pending_price_increases(self) -> list[PriceIncrease]:
        """Price increases hosts asked of our instances; `[]` at a vendor that has none."""
        ...

    def answer_price_increase(self, increase: PriceIncrease, *, accept: bool) -> bool:
        """Accept or reject one; False when it was no longer pending (answered or withdrawn)."""
        ...


class MarketError(TuneharnessError):
    """Root of every error a Market adapter raises."""

    def __init__(self, message: str, *, provider: str = "", status_code: int | None = None) -> None:
        self.provider = provider
        self.status_code = status_code
        super().__init__(f"{provider}: {message}" if provider else message)


class ProviderBusy(MarketError):
    """429 or 5xx: transient. Adapters retry with jittered backoff before raising this."""


class CreateUnconfirmed(ProviderBusy):
    """A create was sent but its answer never came back whole (a read timeout, a dropped
    connection, a 5xx other than 503): the vendor may have rented the instance. Not a refusal: the
    rental keeps its intent and its reservation, and the instance is looked for by its label."""


class OfferGone(MarketError):
    """The offer was taken between search and create: pick the next one."""


class AuthFailed(MarketError):
    """The API key was refused: fix the key; retrying will not help."""


class QuotaExhausted(MarketError):
    """A quota (e.g. Vast's daily search quota) is used up: not retried."""


class ProviderError(MarketError):
    """Anything else, with the vendor's own message."""
