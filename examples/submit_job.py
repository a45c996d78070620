"""Submit a job from Python: validate examples/job.yaml, enqueue it, and read its phase back.

    python examples/submit_job.py            # needs the fleet's broker: `tuneharness up` first
    python examples/submit_job.py --check    # validate only (no broker needed)

The same as `tuneharness submit examples/job.yaml` followed by `tuneharness jobs`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from app.api import get_job, submit  # noqa: E402
from app.errors import UserError  # noqa: E402
from app.jobs import load_job_file  # noqa: E402


def main() -> int:
    model = HERE / "models" / "tiny-causal"
    if not model.exists():
        # The trainer is a program, not a library: run it to write the tiny base model.
        subprocess.run([sys.executable, "-m", "trainer", "make-tiny-model", str(model)], cwd=HERE.parent, check=True)
    try:
        spec = load_job_file(HERE / "job.yaml")
        print(f"valid job file: {spec.name}, needs {list(spec.needs.gpu)} at <= ${spec.needs.max_usd_per_hour}/h")
        if "--check" in sys.argv:
            return 0
        job_id = submit(spec)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"submitted {job_id}: phase {get_job(job_id).phase}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
