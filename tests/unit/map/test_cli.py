"""``gpu-scheduler-map validate``, run as the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kube_gpu_scheduler.mapcli.cli import check_input
from tests.support.mapcorpus import TASK_MAP

MAP_CMD = Path(sys.executable).parent / "gpu-scheduler-map"


def run(
    *args: str, stdin: str | bytes | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(
        [str(MAP_CMD), *args], input=data, capture_output=True, cwd=cwd, timeout=60, check=False
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode(errors="replace")
    )


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


STS = """
# Source: w/templates/statefulset.yaml
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: w
  namespace: default
spec:
  replicas: 3
  template:
    metadata:
      annotations:
        gpu-scheduling-map: |
          0=node1:0,1
          1=node2:2
          2=node3:0,1,2
    spec:
      schedulerName: gpu-scheduler
      containers:
        - name: main
          image: busybox
"""


def test_console_script_is_installed() -> None:
    assert MAP_CMD.exists(), f"{MAP_CMD} missing: pip install -e . first"


def test_raw_map_from_stdin_prints_table() -> None:
    res = run("validate", stdin="0=node1:0,1\n1=node2:2\n")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["ORDINAL", "NODE", "GPUS"]
    assert lines[1].split() == ["0", "node1", "0,1"]
    assert lines[2].split() == ["1", "node2", "2"]
    assert res.stderr == ""


def test_raw_map_dash_and_file(tmp_path: Path) -> None:
    assert run("validate", "-", stdin="0=a:0").returncode == 0
    path = write(tmp_path, "map.txt", "0=a:0 ; 1=b:1 # c\n")
    res = run("validate", str(path))
    assert res.returncode == 0
    assert res.stdout.splitlines()[2].split() == ["1", "b", "1"]


def test_raw_map_errors_name_every_line(tmp_path: Path) -> None:
    path = write(tmp_path, "map.txt", "0=node1:0\n# c\n1=Node2:0\n0=node3:1\nnonsense\n")
    res = run("validate", str(path))
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 3, res.stderr
    assert lines[0].startswith(f"{path}:3: node name 'Node2' is not a valid Kubernetes node name")
    assert lines[1].startswith(f"{path}:4: ordinal 0 is already mapped on line 1")
    assert lines[2].startswith(f"{path}:5: expected ORDINAL=NODE:GPU")
    assert res.stdout == ""


def test_raw_map_crlf_and_bom() -> None:
    res = run("validate", stdin="\ufeff0=a:0\r\n1=b:1\r\n".encode())
    assert res.returncode == 0, res.stderr


def test_statefulset_manifest_table(tmp_path: Path) -> None:
    path = write(tmp_path, "sts.yaml", STS)
    res = run("validate", str(path))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"{path}: StatefulSet default/w (replicas 3)"
    assert lines[1].split() == ["ORDINAL", "NODE", "GPUS"]
    assert [ln.split() for ln in lines[2:]] == [
        ["0", "node1", "0,1"],
        ["1", "node2", "2"],
        ["2", "node3", "0,1,2"],
    ]
    assert res.stderr == ""


def test_statefulset_error_has_map_line_and_file_line(tmp_path: Path) -> None:
    path = write(tmp_path, "sts.yaml", STS.replace("2=node3:0,1,2", "2=node3:0,1,1"))
    res = run("validate", str(path))
    assert res.returncode == 1
    # "2=node3..." is line 3 of the annotation and line 15 of the file.
    assert res.stderr.splitlines() == [
        f"{path}:15: StatefulSet default/w: line 3: GPU 1 is listed twice in this entry (in '2=node3:0,1,1')"
    ]
    assert "ORDINAL" not in res.stdout


def test_multi_document_helm_output(tmp_path: Path) -> None:
    text = (
        textwrap.dedent(
            """
            ---
            # Source: chart/templates/service.yaml
            apiVersion: v1
            kind: Service
            metadata:
              name: svc
            ---
            """
        )
        + textwrap.dedent(STS)
        + textwrap.dedent(
            """
            ---
            apiVersion: apps/v1
            kind: StatefulSet
            metadata:
              name: bad
              namespace: team-a
            spec:
              replicas: 2
              template:
                metadata:
                  annotations:
                    gpu-scheduling-map: |-
                      0=node1:2

                      1=node1:2
                spec:
                  schedulerName: gpu-scheduler
            ---
            apiVersion: v1
            kind: Pod
            metadata:
              name: w-1
              namespace: default
              annotations:
                gpu-scheduling-map: "0=node1:0; 1=node2:x"
            spec:
              schedulerName: gpu-scheduler
            """
        )
    )
    path = tmp_path / "rendered.yaml"
    path.write_text(text)
    lines_of_file = text.split("\n")
    # Replicas 0 and 1 of "bad" share node1:2: a warning on the line of the second sharer.
    res = run("validate", str(path))
    assert res.returncode == 1
    err = res.stderr.splitlines()
    assert len(err) == 2, res.stderr
    prefix = f"{path}:"
    assert err[0].startswith(prefix)
    file_line = int(err[0][len(prefix) :].split(":", 1)[0])
    assert lines_of_file[file_line - 1].strip() == "1=node1:2"
    assert (
        ": warning: StatefulSet team-a/bad: gpu-scheduling-map shares GPUs between replicas: "
        "node1:2 by ordinals 0, 1 (lines 1, 3)" in err[0]
    )
    assert "StatefulSet team-a/bad (replicas 2)" in res.stdout
    # Where the release forbids sharing, the shared NODE:GPU is an error on line 3 of the
    # annotation; check the file line really holds it.
    res = run("validate", "--no-sharing", str(path))
    assert res.returncode == 1
    err = res.stderr.splitlines()
    assert len(err) == 2, res.stderr
    file_line = int(err[0][len(prefix) :].split(":", 1)[0])
    assert lines_of_file[file_line - 1].strip() == "1=node1:2"
    assert (
        ": StatefulSet team-a/bad: line 3: node1:2 is also given to ordinal 0 on line 1: this release "
        "forbids GPU sharing (chart value sharing.allowed=false)" in err[0]
    )
    assert "StatefulSet team-a/bad" not in res.stdout
    # A one-line quoted annotation: the file line is the annotation's own line.
    file_line = int(err[1][len(prefix) :].split(":", 1)[0])
    assert "gpu-scheduling-map:" in lines_of_file[file_line - 1]
    assert ": Pod default/w-1: line 1: GPU 'x' is not an index, a UUID" in err[1]
    # The valid StatefulSet still gets its table.
    assert "StatefulSet default/w (replicas 3)" in res.stdout


def test_the_tasks_map_is_valid_and_its_table_shows_who_shares(tmp_path: Path) -> None:
    path = write(tmp_path, "task.map", TASK_MAP)
    res = run("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "ORDINAL  NODE   GPUS   SHARED WITH",
        "0        node1  0,1",
        "1        node2  2",
        "2        node3  0,1,2",
        "3        node4  3      4",
        "4        node4  3      3",
    ]
    assert res.stderr == (
        f"{path}:5: warning: gpu-scheduling-map shares GPUs between replicas: node4:3 by ordinals 3, 4 "
        "(lines 4, 5); a shared GPU is time-sliced by the driver, with no memory isolation between its "
        "sharers (MIG or MPS give that); sharing.allowed=false forbids sharing\n"
    )
    report = json.loads(run("validate", "--format", "json", str(path)).stdout)
    assert report["ok"] is True
    assert [w["reason"] for w in report["inputs"][0]["maps"][0]["warnings"]] == ["GPUShared"]
    # --strict fails on the warning; --no-sharing refuses the map.
    assert run("validate", "--strict", str(path)).returncode == 1
    refused = run("validate", "--no-sharing", str(path))
    assert refused.returncode == 1 and refused.stdout == ""
    assert "node4:3 is also given to ordinal 3 on line 4: this release forbids GPU sharing" in refused.stderr


def test_list_from_kubectl(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "list.yaml",
        """
        apiVersion: v1
        kind: List
        items:
          - apiVersion: v1
            kind: Pod
            metadata:
              name: w-0
              labels: {apps.kubernetes.io/pod-index: "0"}
              annotations:
                gpu-scheduling-map: |
                  0=n1:0
                  1=n2:0
            spec: {schedulerName: gpu-scheduler}
        """,
    )
    res = run("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert f"{path}: Pod w-0" in res.stdout


def test_replicas_option_and_spec_replicas_warn(tmp_path: Path) -> None:
    res = run("validate", "--replicas", "4", stdin="0=a:0\n1=b:0\n")
    assert res.returncode == 0
    assert "no entry for ordinal 2, 3 (2 of 4 replicas)" in res.stderr
    res = run("validate", "--replicas", "1", stdin="0=a:0\n1=b:0\n")
    assert "ordinal(s) 1 are not used with replicas 1" in res.stderr
    assert run("validate", "--strict", "--replicas", "4", stdin="0=a:0\n").returncode == 1
    # StatefulSet: spec.replicas is used without --replicas.
    path = write(tmp_path, "sts.yaml", STS.replace("replicas: 3", "replicas: 5"))
    res = run("validate", str(path))
    assert res.returncode == 0
    assert (
        f"{path}:12: warning: StatefulSet default/w: gpu-scheduling-map has no entry for ordinal 3, 4 "
        "(2 of 5 replicas)" in res.stderr
    )
    assert run("validate", "--strict", str(path)).returncode == 1
    # --replicas overrides spec.replicas.
    assert run("validate", "--replicas", "3", "--strict", str(path)).returncode == 0


def test_ordinals_start(tmp_path: Path) -> None:
    text = STS.replace("  replicas: 3\n", "  replicas: 2\n  ordinals:\n    start: 1\n")
    path = write(tmp_path, "sts.yaml", text)
    res = run("validate", str(path))
    assert "ordinal(s) 0 are not used with replicas 2 (ordinals 1-2)" in res.stderr


def test_warnings_about_scheduler_name_and_gpu_requests(tmp_path: Path) -> None:
    text = STS.replace("      schedulerName: gpu-scheduler\n", "").replace(
        "          image: busybox\n",
        "          image: busybox\n          resources:\n            limits:\n"
        "              nvidia.com/gpu: 2\n",
    )
    path = write(tmp_path, "sts.yaml", text)
    res = run("validate", str(path))
    assert res.returncode == 0
    # The webhook's words (kube_gpu_scheduler.domain.rules), at the field's line.
    assert (
        "spec.template.spec.schedulerName is not set: the default scheduler will place these pods"
        in res.stderr
    )
    assert "the pod template also requests nvidia.com/gpu ('main')" in res.stderr
    assert run("validate", "--strict", str(path)).returncode == 1
    res = run("validate", "--scheduler-name", "other", str(write(tmp_path, "ok.yaml", STS)))
    assert "spec.template.spec.schedulerName is 'gpu-scheduler', not the GPU scheduler (other)" in res.stderr


def test_annotation_in_wrong_place_and_misspelt(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "sts.yaml",
        """
        apiVersion: apps/v1
        kind: StatefulSet
        metadata:
          name: w
          annotations:
            gpu-scheduling-map: "0=a:0"
        spec:
          template:
            metadata:
              annotations:
                gpu-sheduling-map: "0=a:0"
        """,
    )
    res = run("validate", str(path))
    assert res.returncode == 0
    assert f"{path}:11: warning: annotation 'gpu-sheduling-map' looks like a misspelling" in res.stderr
    assert "own metadata, where it has no effect" in res.stderr


def test_annotation_must_be_a_string(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pod.yaml",
        """
        apiVersion: v1
        kind: Pod
        metadata:
          name: w-0
          annotations:
            gpu-scheduling-map: 5
        """,
    )
    res = run("validate", str(path))
    assert res.returncode == 1
    assert f"{path}:6: Pod w-0: the gpu-scheduling-map annotation must be a string" in res.stderr


def test_folded_block_is_explained(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pod.yaml",
        """
        apiVersion: v1
        kind: Pod
        metadata:
          name: w-0
          annotations:
            gpu-scheduling-map: >
              0=a:0
              1=b:0
        """,
    )
    res = run("validate", str(path))
    assert res.returncode == 1
    assert "folded block ('>')" in res.stderr
    # No file line can be given for a folded scalar's lines: only the map's line.
    assert f"{path}: Pod w-0: line 1:" in res.stderr


def test_manifest_without_annotation(tmp_path: Path) -> None:
    path = write(tmp_path, "svc.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    res = run("validate", str(path))
    assert res.returncode == 0
    assert "no gpu-scheduling-map annotation found" in res.stderr


def test_invalid_yaml_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [x\n")
    res = run("validate", str(path))
    assert res.returncode == 2
    assert res.stderr.startswith(f"{path}:")
    assert "invalid YAML" in res.stderr


def test_unreadable_input_exits_2(tmp_path: Path) -> None:
    res = run("validate", str(tmp_path / "missing.yaml"))
    assert res.returncode == 2
    assert "missing.yaml: cannot read: No such file or directory" in res.stderr
    res = run("validate", str(tmp_path))
    assert res.returncode == 2
    assert "cannot read: Is a directory" in res.stderr
    res = run("validate", stdin=b"0=a:\xff\xfe")
    assert res.returncode == 2
    assert "<stdin>: cannot read: not UTF-8 text" in res.stderr


def test_unreadable_beats_invalid(tmp_path: Path) -> None:
    bad = write(tmp_path, "m.txt", "0=a\n")
    res = run("validate", str(bad), str(tmp_path / "nope"))
    assert res.returncode == 2
    assert "m.txt:1:" in res.stderr


def test_json_format(tmp_path: Path) -> None:
    good = write(tmp_path, "sts.yaml", STS)
    bad = write(tmp_path, "bad.txt", "0=a:0\n0=b:1\n")
    res = run("validate", "--format", "json", str(good), str(bad))
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert doc["ok"] is False
    sts, raw = doc["inputs"]
    assert sts["input"] == "manifest"
    m = sts["maps"][0]
    assert (m["kind"], m["namespace"], m["name"], m["ok"], m["replicas"]) == (
        "StatefulSet",
        "default",
        "w",
        True,
        3,
    )
    assert m["entries"][0] == {
        "ordinal": 0,
        "node": "node1",
        "gpus": [0, 1],
        "gpu_kind": "index",
        "line": 1,
        "file_line": 13,
    }
    assert raw["input"] == "map"
    (e,) = raw["maps"][0]["errors"]
    assert e["line"] == 2 and e["file_line"] == 2 and "already mapped" in e["message"]
    res = run("validate", "--format", "json", str(good))
    assert res.returncode == 0 and json.loads(res.stdout)["ok"] is True


def test_input_override(tmp_path: Path) -> None:
    # A .yaml file holding just a map: auto would read it as YAML (a string, no annotations).
    path = write(tmp_path, "map.yaml", "0=a:0\n")
    assert "no gpu-scheduling-map annotation" in run("validate", str(path)).stderr
    res = run("validate", "--input", "map", str(path))
    assert res.returncode == 0
    assert res.stdout.splitlines()[1].split() == ["0", "a", "0"]
    # And a map in a file without a .yaml suffix, forced to be read as a manifest.
    raw = write(
        tmp_path, "map.txt", "kind: Pod\nmetadata: {name: w-0, annotations: {gpu-scheduling-map: '0=a:0'}}\n"
    )
    assert run("validate", str(raw)).returncode == 0
    assert run("validate", "--input", "map", str(raw)).returncode == 1


def test_usage_errors_exit_2() -> None:
    assert run().returncode == 2
    assert run("validate", "--replicas", "-1").returncode == 2
    assert run("validate", "--format", "xml").returncode == 2
    assert "validate" in run("--help").stdout


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [
        ("-", "0=a:0", "map"),
        ("x.txt", "0=a:0", "map"),
        ("x.yml", "kind: Pod\n", "manifest"),
        ("-", "---\napiVersion: v1\nkind: Pod\n", "manifest"),
        ("-", "- apiVersion: v1\n", "manifest"),
        ("x.JSON", '{"kind": "Pod"}', "manifest"),
    ],
)
def test_input_detection(name: str, text: str, kind: str) -> None:
    assert check_input(name, text).kind == kind


def test_huge_replicas_do_not_hang() -> None:
    report = check_input("-", "0=a:0", replicas=1_000_000_000).maps[0]
    assert report.warnings and "ordinal 1, 2, 3, 4, 5 and 999999994 more" in report.warnings[0]["message"]
    assert report.warnings[0]["reason"] == "OrdinalNotInMap"


def test_empty_input_exits_2() -> None:
    res = run("validate", stdin="")
    assert res.returncode == 2
    assert "<stdin>: empty input: no map to check" in res.stderr
    # A map of comments only is a map without entries: invalid, not unreadable.
    res = run("validate", stdin="# nothing yet\n")
    assert res.returncode == 1
    assert "the map has no entries" in res.stderr


def test_gpus_named_by_uuid_and_pci_bus_id_are_shown_normalized_and_pci_needs_dra(tmp_path: Path) -> None:
    uuid = "GPU-8A3C0D4E-1234-5678-9ABC-DEF012345678"
    raw = write(tmp_path, "map.txt", f"0=node1:{uuid}\n1=node2:00000000:3B:00.0\n")
    res = run("validate", str(raw))
    assert res.returncode == 0, res.stderr
    assert f"node1  {uuid[:4]}{uuid[4:].lower()}" in res.stdout
    assert "node2  0000:3b:00.0" in res.stdout
    assert (
        f"{raw}:2: warning: gpu-scheduling-map line 2: replica 1 is mapped to node2:0000:3b:00.0"
        in res.stderr
    )
    assert "PCI bus IDs name GPUs only in DRA mode" in res.stderr
    assert run("validate", "--strict", str(raw)).returncode == 1
    # A cluster in DRA mode: nothing to say.
    dra = run("validate", "--strict", "--dra", str(raw))
    assert dra.returncode == 0 and not dra.stderr, dra.stderr
    doc = json.loads(run("validate", "--dra", "--format", "json", str(raw)).stdout)
    assert [(e["gpus"], e["gpu_kind"]) for e in doc["inputs"][0]["maps"][0]["entries"]] == [
        ([f"GPU-{uuid[4:].lower()}"], "uuid"),
        (["0000:3b:00.0"], "pci"),
    ]
    # A node named two ways is an error naming both lines.
    mixed = write(tmp_path, "mixed.txt", f"0=node1:0\n1=node1:{uuid}\n")
    res = run("validate", str(mixed))
    assert res.returncode == 1
    assert f"{mixed}:2: node 'node1' has its GPUs named by UUID here and by index on line 1" in res.stderr


def test_a_count_entry_is_shown_and_needs_dra_mode(tmp_path: Path) -> None:
    raw = write(
        tmp_path,
        "map.txt",
        "0=node1:0000:3b:00.0\n# two GPUs of node4, one PCIe root\n3=node4:3\n4=node4:3\n5=node4:auto(02)\n",
    )
    res = run("validate", str(raw))
    assert res.returncode == 0, res.stderr
    assert "node4  auto(2)" in res.stdout
    assert f"{raw}:5: warning: gpu-scheduling-map line 5: replica 5 asks for node4:auto(2)" in res.stderr
    assert "only in DRA mode (chart value dra.enabled=true)" in res.stderr
    assert (
        f"{raw}:1: warning: gpu-scheduling-map line 1: replica 0 is mapped to node1:0000:3b:00.0"
        in res.stderr
    )
    assert run("validate", "--strict", str(raw)).returncode == 1
    dra = run("validate", "--dra", str(raw))  # the shared GPU 3 is still said
    assert dra.returncode == 0 and "DRA mode" not in dra.stderr and "node4:3 by ordinals 3, 4" in dra.stderr
    doc = json.loads(run("validate", "--dra", "--format", "json", str(raw)).stdout)
    entries = doc["inputs"][0]["maps"][0]["entries"]
    assert [(e["ordinal"], e["gpus"], e.get("count"), e["gpu_kind"]) for e in entries][-1] == (
        5,
        [],
        2,
        "count",
    )
    bad = run("validate", stdin="0=node1:auto(0)\n")
    assert bad.returncode == 1 and "<stdin>:1: GPU count 0 asks for no GPU" in bad.stderr
