"""DRA device taints (``resource.k8s.io/v1``, GA in Kubernetes 1.37): which taints a GPU carries.

A device is tainted two ways, with the same effect:

* by its DRA driver, in the ResourceSlice: ``spec.devices[].taints``, each
  ``{key, value, effect, timeAdded}`` (a driver taints a device it finds unhealthy);
* by a ``DeviceTaintRule`` (cluster-scoped, written by an admin): ``spec.deviceSelector``
  (``driver``, ``pool``, ``device``: each optional, all that are set must match; an empty
  selector matches every device, no selector matches none) and one ``spec.taint``.

Effects: ``NoSchedule`` (kube-scheduler allocates the device to no claim that does not
tolerate it), ``NoExecute`` (the same, and kube-controller-manager's device taint eviction
deletes the running pods of the claims it is allocated to), ``None`` (informational). An
effect this code does not know is treated like ``None``, as the API asks of consumers.

gpu-scheduler's claims carry no tolerations: every ``NoSchedule`` or ``NoExecute`` taint
keeps a replica off the device. Pure functions over plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
# The effects that keep a claim without tolerations off a device.
BLOCKING = (NO_SCHEDULE, NO_EXECUTE)
ANY = "*"  # a DeviceTaintRule whose selector names no pool: it may select a device of any pool


@dataclass(frozen=True)
class Taint:
    """One taint on a device: ``rule`` names the DeviceTaintRule that sets it ("": its ResourceSlice)."""

    key: str
    value: str
    effect: str
    rule: str = ""

    @property
    def blocks(self) -> bool:
        """Whether it keeps a claim without tolerations off the device (NoSchedule, NoExecute)."""
        return self.effect in BLOCKING

    @property
    def evicts(self) -> bool:
        return self.effect == NO_EXECUTE

    def text(self) -> str:
        """``key=value:Effect`` (``key:Effect`` without a value), as kubectl writes a node taint."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"

    def source(self) -> str:
        return f"DeviceTaintRule {self.rule}" if self.rule else "its ResourceSlice, set by the DRA driver"

    def describe(self) -> str:
        """``maint=now:NoExecute (DeviceTaintRule gpu-maint)``"""
        return f"{self.text()} ({self.source()})"


def _taint(raw: Any, rule: str = "") -> Taint | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("key"), str):
        return None
    return Taint(str(raw["key"]), str(raw.get("value") or ""), str(raw.get("effect") or ""), rule)


def slice_taints(device: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The taints a ResourceSlice's ``spec.devices[]`` item carries."""
    return tuple(t for raw in device.get("taints") or () if (t := _taint(raw)) is not None)


def _selector(rule: Mapping[str, Any]) -> Mapping[str, Any] | None:
    selector = (rule.get("spec") or {}).get("deviceSelector")
    return selector if isinstance(selector, Mapping) else None


def _name(rule: Mapping[str, Any]) -> str:
    return str((rule.get("metadata") or {}).get("name") or "")


def rule_pools(rule: Mapping[str, Any], driver: str) -> set[str]:
    """The pools whose devices of ``driver`` the rule may taint: its pool, :data:`ANY` when its
    selector names none, nothing when it has no selector or names another driver."""
    selector = _selector(rule)
    if selector is None or selector.get("driver") not in (None, driver):
        return set()
    pool = selector.get("pool")
    return {str(pool)} if pool is not None else {ANY}


def rule_taint(rule: Mapping[str, Any], driver: str, pool: str, device: str) -> Taint | None:
    """The taint ``rule`` puts on device ``driver/pool/device``, or None when it does not select it."""
    selector = _selector(rule)
    if selector is None:
        return None  # no selector matches no device
    for field, value in (("driver", driver), ("pool", pool), ("device", device)):
        if selector.get(field) is not None and selector.get(field) != value:
            return None
    return _taint((rule.get("spec") or {}).get("taint"), _name(rule))


def blocking(taints: Iterable[Taint]) -> list[Taint]:
    """The taints that keep a claim without tolerations off the device, NoExecute first."""
    return sorted((t for t in taints if t.blocks), key=lambda t: (not t.evicts, t.rule, t.key))
