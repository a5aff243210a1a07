"""Arm E's hold on the gpu-scheduler: its Lease taken by the harness while the pods are created
(the scheduler stops leading), then given back; the clock starts when it leads again."""

from __future__ import annotations

import json
import time
import urllib.request

from bench.raw import ApiError, Raw
from kube_gpu_scheduler.kube.timefmt import micro_time

HOLDER = "bench-holds-the-lease"


class HeldLease:
    """The Lease at ``path`` (the scheduler's), and the scheduler's ``/health`` at ``health_url``."""

    def __init__(self, raw: Raw, path: str, health_url: str) -> None:
        self.raw, self.path, self.health_url = raw, path, health_url

    def _write(self, holder: str | None) -> None:
        for _ in range(50):
            lease = self.raw.get(self.path)
            spec = lease.setdefault("spec", {})
            spec["holderIdentity"] = holder
            spec["leaseDurationSeconds"] = 100  # under 10x the scheduler's 15 s: not "absurd"
            spec["renewTime"] = spec["acquireTime"] = micro_time()
            try:
                self.raw.request("PUT", self.path, json.dumps(lease).encode(), ok=(200,), tries=1)
                return
            except ApiError as err:
                if "HTTP 409" not in str(err):
                    raise
        raise ApiError("could not write the scheduler's Lease (409 fifty times)")

    def _leads(self) -> bool:
        with urllib.request.urlopen(self.health_url, timeout=5) as resp:  # noqa: S310 (http://127.0.0.1)
            return bool(json.loads(resp.read()).get("leader"))

    def hold(self) -> None:
        """Take the scheduler's Lease, and wait until it has stopped leading."""
        self._write(HOLDER)
        deadline = time.monotonic() + 60
        while self._leads():
            if time.monotonic() > deadline:
                raise ApiError("the scheduler still leads 60 s after its Lease was taken")
            time.sleep(0.05)

    def go(self) -> float:
        """Give the Lease back; the moment the scheduler leads again (it polls every 2 s).

        It lies after the last ``/health`` ask that still said "not leading" (or the Lease's
        release) began: that start is returned, so no latency from it is negative. The first
        "leading" answer can come after the scheduler bound its first pods (20 in a few ms: the
        smoke test once saw a p50 of -7 ms)."""
        last_no = time.monotonic()  # the scheduler cannot lead before its Lease is given back
        self._write(None)
        deadline = last_no + 60
        while True:
            asked = time.monotonic()
            if self._leads():
                return last_no
            last_no = asked
            if asked > deadline:
                raise ApiError("the scheduler did not take its Lease back within 60 s")
            time.sleep(0.01)
