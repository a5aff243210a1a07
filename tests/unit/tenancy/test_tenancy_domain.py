"""Tenancy's pure parts: label selectors, the policy model, the grants admission reads, the
status the scheduler writes, and the rules' words (kube_gpu_scheduler.domain.tenancy,
.selectors, .rules.tenancy)."""

from __future__ import annotations

from typing import Any

import pytest

from kube_gpu_scheduler.domain import rules as R
from kube_gpu_scheduler.domain.schedmap import parse
from kube_gpu_scheduler.domain.selectors import SelectorError, parse_selector
from kube_gpu_scheduler.domain.tenancy import (
    ENFORCED,
    LIMIT_REACHED,
    Grants,
    Held,
    Policy,
    holders_text,
    same_status,
    status_of,
)
from kube_gpu_scheduler.scheduler.tenancy.status import REASONS


def policy(name: str, ns: dict[str, Any], nodes: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 2},
        "spec": {"namespaceSelector": ns, "nodeSelector": nodes, **spec},
    }


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {}, True),
        ({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, True),
        ({"matchLabels": {"team": "a"}}, {"team": "b"}, False),
        (
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]},
            {"pool": "b"},
            True,
        ),
        ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}, {"pool": "a"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": ""}, False),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
            {"a": "1"},
            False,
        ),
    ],
)
def test_a_label_selector_matches_as_the_apiserver_does(
    selector: dict[str, Any], labels: dict[str, str], matches: bool
) -> None:
    assert parse_selector(selector).matches(labels) is matches


@pytest.mark.parametrize(
    "selector",
    [
        {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
        {"matchExpressions": [{"key": "a", "operator": "In"}]},
        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
        {"matchLabels": {"a": 1}},
        [],
    ],
)
def test_a_selector_the_apiserver_refuses_is_refused(selector: Any) -> None:
    with pytest.raises(SelectorError):
        parse_selector(selector)


def test_a_policy_parses_its_limits_and_an_unparsable_one_grants_nothing() -> None:
    p = Policy.of(
        policy(
            "shared",
            {"matchLabels": {"tier": "research"}},
            {"matchLabels": {"pool": "shared"}},
            maxGPUs=8,
            gpuTypes=[{"product": "A100", "maxGPUs": 2}],
        )
    )
    assert (p.name, p.generation, p.max_gpus, p.types, p.problem) == ("shared", 2, 8, (("A100", 2),), "")
    assert p.limits("A100") == [("spec.maxGPUs", 8), ("spec.gpuTypes[A100]", 2)]
    assert p.limits("H100") == [("spec.maxGPUs", 8)]
    assert p.selects_namespace({"tier": "research"}) and not p.selects_node({"pool": "a"})
    broken = Policy.of({"metadata": {"name": "b"}, "spec": {"nodeSelector": {}}})
    assert broken.problem and not broken.selects_namespace({}) and not broken.selects_node({})
    assert Policy.of(policy("t", {}, {}, gpuTypes=[{"product": "A", "maxGPUs": -1}])).problem


def test_the_grants_resolve_and_round_trip_through_the_configmap() -> None:
    policies = [
        Policy.of(policy("team-a", {"matchLabels": {"team": "a"}}, {"matchLabels": {"pool": "a"}})),
        Policy.of(policy("shared", {"matchExpressions": [{"key": "team", "operator": "Exists"}]}, {"matchLabels": {"pool": "s"}})),
    ]  # fmt: skip
    grants = Grants.resolve(
        policies,
        {"ta": {"team": "a"}, "tb": {"team": "b"}, "nobody": {}},
        {"a1": {"pool": "a"}, "s1": {"pool": "s"}, "b1": {"pool": "b"}},
    )
    data = grants.to_data()
    assert data == {"ns.ta": "shared,team-a", "ns.tb": "shared", "policy.shared": "s1", "policy.team-a": "a1"}
    again = Grants.from_data(data)
    assert again == grants
    assert again.granted("ta", "a1") and again.granted("tb", "s1")
    assert not again.granted("tb", "a1") and not again.granted("nobody", "s1")
    assert again.considered("nobody") == ()


def test_admission_names_the_line_the_node_and_the_policies_considered() -> None:
    grants = Grants({"team-a": frozenset({"a1"}), "shared": frozenset({"s1"})}, {"ta": ("shared", "team-a")})
    smap = parse("0=a1:0\n# a comment\n2=b9:0 ; 1=b9:1\n3=s1:0")
    (finding,) = R.map_not_granted(smap.entries.values(), "ta", grants)
    assert finding.reason == R.NOT_GRANTED
    assert finding.message == (
        "gpu-scheduling-map line 3: replica 2 is mapped to node 'b9', which no GPUPinningPolicy grants "
        "namespace 'ta' (policies considered: shared, team-a) (and 1 more entry)"
    )
    (alone,) = R.map_not_granted(parse("0=a1:0").values(), "other", grants)
    assert "policies considered: none selects namespace 'other'" in alone.message
    assert R.map_not_granted(parse("0=a1:0\n1=s1:1").values(), "ta", grants) == []


def test_the_schedulers_words_name_the_policy_the_limit_and_the_holders() -> None:
    entry = parse("2=s1:0,1")[2]
    finding = R.limit_reached("shared", "spec.maxGPUs", 4, "", 3, ["ta/w-0 s1:2,3", "tb/x-0 s2:0"], entry, 2)
    assert finding.message.startswith(
        "GPUPinningPolicy 'shared' allows 4 GPUs (spec.maxGPUs) to the namespaces it selects on its "
        "nodes; 3 are held (ta/w-0 s1:2,3; tb/x-0 s2:0) and replica 2 needs 2 more (2=s1:0,1)"
    )
    typed = R.limit_reached("shared", "spec.gpuTypes[A100]", 1, "A100", 1, ["ta/w-0 s1:2"], entry, 2)
    assert "allows 1 GPU of type 'A100' (spec.gpuTypes[A100])" in typed.message
    assert holders_text([f"n/p-{i} x:0" for i in range(7)]).endswith("n/p-4 x:0; and 2 more")
    nobody = R.not_granted("tc", entry, [])
    assert "no GPUPinningPolicy selects namespace 'tc'" in nobody.message
    other = R.not_granted("ta", entry, [("team-a", "pool=a")])
    assert "policies considered: team-a (nodeSelector pool=a)" in other.message


@pytest.mark.parametrize(
    ("labels", "advice"),
    [
        ({}, "kubectl label namespace ns gpu-scheduling=enabled"),
        ({"kubernetes.io/metadata.name": "kube-system"}, "excluded by name"),
    ],
)
def test_a_namespace_not_served_is_told_how_to_opt_in(labels: dict[str, str], advice: str) -> None:
    scope = parse_selector(
        {
            "matchLabels": {"gpu-scheduling": "enabled"},
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
            ],
        }
    )
    finding = R.not_opted_in("ns", scope, labels, parse("0=n1:0")[0])
    assert finding.reason == R.NAMESPACE_NOT_OPTED_IN and advice in finding.message


def test_the_status_counts_per_namespace_and_type_and_keeps_transition_times() -> None:
    p = Policy.of(policy("shared", {}, {}, maxGPUs=3, gpuTypes=[{"product": "A100", "maxGPUs": 2}]))
    held = Held()
    held.add("ta", "A100", 2)
    held.add("tb", "", 1)
    status = status_of(p, held, 5, None, "2030-01-01T00:00:00Z", REASONS)
    assert status["held"] == 3 and status["nodes"] == 5 and status["observedGeneration"] == 2
    assert status["namespaces"] == [
        {"namespace": "ta", "gpus": 2, "types": [{"product": "A100", "gpus": 2}]},
        {"namespace": "tb", "gpus": 1, "types": []},
    ]
    assert status["types"] == [{"product": "A100", "maxGPUs": 2, "held": 2}]
    cond = {c["type"]: c for c in status["conditions"]}
    assert cond[ENFORCED]["status"] == "True" and cond[LIMIT_REACHED]["status"] == "True"
    assert cond[LIMIT_REACHED]["reason"] == R.POLICY_AT_LIMIT
    later = status_of(p, held, 5, status, "2031-01-01T00:00:00Z", REASONS)
    assert same_status(status, later) and later["conditions"] == status["conditions"]
    held.add("ta", "A100", -2)
    freed = status_of(p, held, 5, status, "2031-01-01T00:00:00Z", REASONS)
    assert not same_status(status, freed)
    assert {c["type"]: c["lastTransitionTime"] for c in freed["conditions"]}[LIMIT_REACHED].startswith("2031")
