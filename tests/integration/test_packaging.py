"""What a user installs runs: each program of the wheel and of the image's venv, started until it serves.

Two installs (tests/support/wheelvenv.py, fresh venvs that borrow nothing from the test
virtualenv): ``wheel_venv``, a user's ``pip install .`` with its dependencies resolved by pip
from the wheel's metadata, and ``image_venv``, the Dockerfile's build stage (the hashed lock,
then the wheel). Every test runs on both, as a user would run the programs:

* ``gpu-scheduler-webhook`` with certificates from ``./generate-webhook-certs.py`` (run by the
  venv's python): HTTPS ``/healthz`` and ``/readyz`` answer, and an AdmissionReview gets its
  patch and its ``uid`` back;
* ``gpu-scheduler`` with the chart's ServiceAccount token against the local control plane:
  ``/health`` answers and it binds a mapped StatefulSet replica;
* ``gpu-scheduler-map validate`` on examples/gpu-workload.yaml (the task's map: a shared GPU, a warning);
* ``gpu-scheduler-check serve``: ready when the placement matches; with the image's nvml extra
  it reads the fake NVML (tests/support/fakenvml), without it it says pynvml is missing.

A dependency that pip does not install (one undeclared in pyproject.toml, or missing from the
lock) fails here the way it fails a user: the program's log shows the ModuleNotFoundError.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.admission import admission_review, mapped_pod
from localcluster.cluster import Cluster, free_port
from localcluster.procs import ManagedProcess
from localcluster.rbac import ChartIdentity
from tests.integration.fixtures_scheduler import statefulset
from tests.support.fakenvml import nvml_env
from tests.support.kubeapi import read_pod
from tests.support.waiting import wait_for
from tests.support.wheelvenv import REPO, SCRIPTS, WheelVenv, clean_env

HOST = "127.0.0.1"
VARIANTS = ("wheel_venv", "image_venv")


@pytest.fixture(params=VARIANTS)
def installed(request: pytest.FixtureRequest) -> WheelVenv:
    """Each install in turn (both are made once per session)."""
    venv: WheelVenv = request.getfixturevalue(request.param)
    return venv


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[ManagedProcess]]:
    """Processes a test starts; stopped afterwards, their log's tail shown when the test failed."""
    procs: list[ManagedProcess] = []
    yield procs
    for proc in procs:
        proc.stop()
        print(f"--- {proc.name}: {proc.log_path} (last 40 lines) ---\n{proc.log_text(40)}")


def start(
    procs: list[ManagedProcess], venv: WheelVenv, name: str, argv: list[str], env: dict[str, str], work: Path
) -> ManagedProcess:
    proc = ManagedProcess(
        name,
        [str(venv.bin / argv[0]), *argv[1:]],
        env=venv.env(env, home=work),
        log_path=work / f"{name}.log",
        cwd=work,
    )
    procs.append(proc)
    return proc.start()


def json_records(proc: ManagedProcess) -> list[dict[str, Any]]:
    out = []
    for line in proc.log_text().splitlines():
        assert line.startswith("{"), f"{proc.name}: not a JSON log line: {line!r}"
        out.append(json.loads(line))
    return out


# -- the webhook -----------------------------------------------------------------------------


def mapped_pod_review(uid: str) -> dict[str, Any]:
    pod = mapped_pod("w-1", "0=node1:0,1\n1=node2:2\n", containers=[{"name": "main", "image": "app"}])
    pod["metadata"]["labels"] = {"apps.kubernetes.io/pod-index": "1"}
    return admission_review({"apiVersion": "v1", "kind": "Pod", **pod}, uid=uid, resource=True)


def https(port: int, ca: Path, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection(
        HOST, port, context=ssl.create_default_context(cafile=str(ca)), timeout=10
    )
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_webhook_serves_with_certificates_from_the_script(
    installed: WheelVenv, started: list[ManagedProcess], tmp_path: Path
) -> None:
    # The README's `./generate-webhook-certs.py`: its `python3` is the venv's, first on PATH.
    certs = tmp_path / "certs"
    res = subprocess.run(
        [
            str(REPO / "generate-webhook-certs.py"),
            "--ip",
            HOST,
            "--dns",
            "localhost",
            "--output-dir",
            str(certs),
        ],
        env=installed.env(home=tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    port = free_port()
    proc = start(
        started,
        installed,
        "gpu-scheduler-webhook",
        ["gpu-scheduler-webhook", "--bind", f"{HOST}:{port}"],
        {"WEBHOOK_TLS_CERT_FILE": str(certs / "tls.crt"), "WEBHOOK_TLS_KEY_FILE": str(certs / "tls.key")},
        tmp_path,
    )
    proc.wait_http(f"https://{HOST}:{port}/healthz", timeout=60, cafile=certs / "ca.crt")
    assert https(port, certs / "ca.crt", "GET", "/readyz")[0] == 200

    status, raw = https(port, certs / "ca.crt", "POST", "/mutate", mapped_pod_review("pkg-uid-1"))
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "pkg-uid-1"
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    env = {
        e["name"]: e["value"] for op in patch for e in (op["value"] if isinstance(op["value"], list) else [])
    }
    assert env == {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, patch

    proc.stop()
    assert proc.proc is not None and proc.proc.returncode == 0, proc.log_text(40)
    assert json_records(proc)  # it logged, in JSON, and nothing else


# -- the scheduler ---------------------------------------------------------------------------


def test_scheduler_serves_and_binds_a_mapped_replica(
    installed: WheelVenv,
    cluster: Cluster,
    namespace: str,
    kube: Any,
    scheduler_identity: ChartIdentity,
    started: list[ManagedProcess],
    tmp_path: Path,
) -> None:
    node = f"{namespace}-pkg"
    cluster.add_gpu_node(node)
    try:
        port = free_port()
        proc = start(
            started,
            installed,
            "gpu-scheduler",
            ["gpu-scheduler"],
            {
                "KUBECONFIG": str(scheduler_identity.kubeconfig),
                "GPU_SCHEDULER_HTTP_ADDRESS": HOST,
                "GPU_SCHEDULER_HTTP_PORT": str(port),
                "POD_NAME": "packaging",
                "POD_NAMESPACE": namespace,
                # No webhook in this test: the scheduler-only install.
                "GPU_SCHEDULER_REQUIRE_INJECTION": "false",
            },
            tmp_path,
        )
        proc.wait_http(f"http://{HOST}:{port}/readyz", timeout=60)
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5) as resp:
            assert resp.status == 200
            assert json.loads(resp.read())["status"] == "ok"

        cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(statefulset("pkg", f"0={node}:1,3", 1))
        )
        pod = wait_for(
            lambda: (p := read_pod(kube, namespace, "pkg-0")) and p["spec"].get("nodeName") and p,
            60,
            what="pkg-0 bound",
        )
        assert pod["spec"]["nodeName"] == node
        proc.stop()
        assert json_records(proc)
    finally:
        cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)


# -- the command-line validator and the check program -----------------------------------------


def test_map_validates_the_example(installed: WheelVenv, tmp_path: Path) -> None:
    example = REPO / "examples" / "gpu-workload.yaml"
    res = subprocess.run(
        [str(installed.bin / "gpu-scheduler-map"), "validate", str(example)],
        env=installed.env(home=tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for placed in ("node1", "node2", "node3", "node4"):
        assert placed in res.stdout
    # The task's map shares node4's GPU 3: accepted, with a warning that names it.
    assert "shares GPUs between replicas: node4:3 by ordinals 3, 4" in res.stderr, res.stderr
    bad = subprocess.run(
        [str(installed.bin / "gpu-scheduler-map"), "validate", "-"],
        input=example.read_text().replace("1=node2:2", "1=node2:2,02"),
        env=installed.env(home=tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "GPU 2 is listed twice in this entry" in bad.stdout + bad.stderr


CHECK_ENV = {
    "POD_NAME": "w-1",
    "POD_NAMESPACE": "ns",
    "NODE_NAME": "node2",
    "POD_INDEX": "1",
    "GPU_SCHEDULING_MAP": "0=node1:1\n1=node2:0\n",
    "CUDA_VISIBLE_DEVICES": "0",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "GPU_INJECTION_MODE": "cuda",
    "CHECK_INTERVAL_SECONDS": "1",
}


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_check_serves_and_reads_nvml(
    installed: WheelVenv, fake_nvml: Path, started: list[ManagedProcess], tmp_path: Path
) -> None:
    port = free_port()
    termination = tmp_path / "termination-log"
    termination.touch()  # the kubelet creates it; the program writes it only when it exists
    proc = start(
        started,
        installed,
        "gpu-scheduler-check",
        ["gpu-scheduler-check", "serve"],
        {
            **CHECK_ENV,
            **nvml_env(fake_nvml, gpus=1),
            "CHECK_PORT": str(port),
            "CHECK_TERMINATION_MESSAGE_PATH": str(termination),
        },
        tmp_path,
    )
    proc.wait_http(f"http://{HOST}:{port}/healthz", timeout=60)
    status, body = readyz(port)
    nvml = next(c for c in body["checks"] if c["check"] == "nvml")
    if "nvml" not in installed.extras:
        # A plain `pip install .`: no NVML bindings (the nvml extra), and the check says so.
        assert status == 503, body
        assert nvml["ok"] is False and "pynvml is not installed" in nvml["actual"], nvml
        # Nor has this host any /dev/nvidia*: dev fails beside it (the stand-in NVML is unread).
        assert [c["check"] for c in body["failed"]] == ["nvml", "dev"], body
        dev = next(c for c in body["checks"] if c["check"] == "dev")
        assert dev["actual"] == {"gpus": [], "nvidiactl": False}, dev
    else:
        # The image (nvml extra): pynvml loads the fake libnvidia-ml.so.1 as it would the driver's.
        assert status == 200, body
        assert nvml["ok"] is True, nvml
    proc.stop()
    assert proc.proc is not None and proc.proc.returncode == 0, proc.log_text(40)
    assert json.loads(termination.read_text())
    assert json_records(proc)


# -- beside the index's packages whose names ours once shared ---------------------------------

# `scheduler` (an in-process job scheduler: its own top-level package scheduler/) and
# `gpu-scheduler` (an unrelated tool: gpu_scheduler/): before 0.2 our wheel wrote into
# site-packages/scheduler/ too, and the two clobbered each other's __init__.py.
NEIGHBOURS = ("scheduler", "gpu-scheduler")


@pytest.mark.slow(
    reason="pip installs a fresh venv from the package index (two packages, then our wheel and its "
    "dependencies): about 90 s here, 163 s on a day the index and the machine were slow",
    budget=300,
)
def test_console_scripts_work_beside_the_index_packages_named_like_ours(
    wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    root = tmp_path / "venv"
    subprocess.run([wheel_venv.base_python, "-m", "venv", str(root)], check=True, timeout=300)
    # --no-compile: the byte-code of a few thousand modules is none of this test's business
    # (about 11 s of CPU of the 30 s an install of ours takes on an idle machine).
    pip = [
        str(root / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-compile",
    ]
    env = clean_env()
    # Theirs first, then ours on top: the order in which ours replaced their __init__.py.
    for args in ([*NEIGHBOURS], [str(wheel_venv.wheel)]):
        res = subprocess.run([*pip, *args], env=env, capture_output=True, text=True, timeout=900, check=False)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    venv = WheelVenv(root, wheel_venv.wheel, "beside scheduler and gpu-scheduler", wheel_venv.base_python)
    for script in SCRIPTS:
        res = subprocess.run(
            [str(venv.bin / script), "--help"],
            env=venv.env(home=tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0 and res.stdout.strip(), f"{script}: {res.stderr[-2000:]}"
    # Theirs still import as theirs, and no file of one distribution is another's.
    code = (
        "import importlib.metadata as m, json\n"
        "from scheduler import Scheduler\n"
        "import gpu_scheduler, kube_gpu_scheduler\n"
        "files = {d: sorted(str(f) for f in m.files(d) if '.dist-info' not in str(f) and '__pycache__' not in str(f)"
        " and not str(f).startswith('..')) for d in ('scheduler', 'gpu-scheduler', 'kube-gpu-scheduler')}\n"
        "print(json.dumps(files))"
    )
    res = subprocess.run(
        [str(venv.python), "-I", "-c", code],
        env=venv.env(home=tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    files = {dist: set(paths) for dist, paths in json.loads(res.stdout).items()}
    ours = files.pop("kube-gpu-scheduler")
    assert {p.split("/", 1)[0] for p in ours} == {"kube_gpu_scheduler"}
    for dist, theirs in files.items():
        assert theirs and not ours & theirs, dist
