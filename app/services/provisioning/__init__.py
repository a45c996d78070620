"""The real-time driver of the provisioning policy (see `service.py`), split by concern:

- `state`: each job's versioned policy state between tasks;
- `effects`: what each of the policy's actions does in real time (rentals, budget, pool, ledger);
- `standby`: standby pools, hedged recoveries, hand-overs;
- `holds`: held hosts and beat's sweep over them;
- `service`: the steps the Celery tasks call, each under the job's step lease.
"""

from app.services.provisioning.service import PreflightRunner, ProvisioningService
from app.services.provisioning.state import ProvisioningStateRow, StateStore
from app.services.provisioning.types import HoldSweep, Step, StepBusy

__all__ = [
    "HoldSweep",
    "PreflightRunner",
    "ProvisioningService",
    "ProvisioningStateRow",
    "StateStore",
    "Step",
    "StepBusy",
]
