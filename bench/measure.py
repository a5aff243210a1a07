"""What a host process costs: its memory and CPU time with its descendants (``/proc``), and
the summary of a py-spy profile (samples per function and per area)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def own_times(log_lines: list[str], namespace: str) -> dict[str, float]:
    """Each pod of ``namespace`` the scheduler bound: the seconds it spent inside the scheduler,
    from the watch event that showed it pending to its Binding's answer, less the Binding's
    round trip (``latency_s - bind_s`` of its "bound" log line): queue, decision, reservation."""
    spent: dict[str, float] = {}
    prefix = f'"{namespace}/'
    for line in log_lines:
        if '"msg":"bound"' not in line or prefix not in line:
            continue
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            ns, _, name = str(rec.get("pod", "")).partition("/")
            latency, bind = rec.get("latency_s"), rec.get("bind_s")
            if ns == namespace and isinstance(latency, (int, float)) and isinstance(bind, (int, float)):
                spent[name] = max(0.0, latency - bind)
    return spent


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` and every descendant (gunicorn's master and workers), in MiB."""
    total_kib = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
    return round(total_kib / 1024, 1)


def peak_rss_mib(pid: int) -> float:
    """VmHWM of ``pid`` (its peak resident set since it started), in MiB."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants that are alive now (gunicorn workers), in seconds."""
    return sum(process_cpu_seconds(p) for p in [pid, *descendants(pid)])


def stat_cpu_seconds(stat: str, ticks: int) -> float:
    """utime + stime, in seconds, from the text of a ``/proc/<pid>/stat`` (fields 14 and 15, in
    clock ticks). The command name (field 2) is in parentheses and may hold spaces and ``)``:
    the fields are counted from its last ``)``."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def process_cpu_seconds(pid: int, proc: Path = Path("/proc"), ticks: int | None = None) -> float:
    """utime + stime of ``pid`` alone (no descendants: kube-apiserver has none), in seconds; 0.0
    when it is gone."""
    try:
        return stat_cpu_seconds((proc / str(pid) / "stat").read_text(), ticks or os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process spent between two readings (``Harness.cpu``), to the millisecond."""
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}


def settle(
    busy_seconds: Callable[[], float],
    *,
    window: float = 1.0,
    quiet: float = 0.3,
    cap: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, float]:
    """Wait until the control plane is done with the previous arm: its pods deleted, the
    apiserver, etcd, kwok and the controllers still busy with their watch events, Events and
    garbage collection would otherwise be charged to the next arm (the arm that came after B2
    read the slowest of four). ``busy_seconds`` is their CPU seconds so far; each ``window``
    their CPU rate is read, and the wait ends once it is under ``quiet`` cores or stops
    falling (it is the machine's floor, not the previous arm's tail), or after ``cap``
    seconds. Returns (seconds waited, the last rate in cores)."""
    waited, rate, last = 0.0, float("inf"), busy_seconds()
    while waited < cap:
        sleep(window)
        waited += window
        now = busy_seconds()
        previous, rate = rate, max(0.0, now - last) / window
        last = now
        if rate <= quiet or rate >= 0.9 * previous:
            break
    return waited, rate


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def summarise_profile(text: str, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample counts per function, and self samples per area (package)."""
    self_counts: dict[str, int] = {}
    incl_counts: dict[str, int] = {}
    areas: dict[str, int] = {}
    total = waiting = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        leaf = frames[-1]
        if leaf.startswith(_WAITING):
            waiting += count
            continue
        self_counts[leaf] = self_counts.get(leaf, 0) + count
        for frame in set(frames):
            incl_counts[frame] = incl_counts.get(frame, 0) + count
        areas[area_of(frames)] = areas.get(area_of(frames), 0) + count

    def ranked(counts: dict[str, int]) -> list[tuple[str, int]]:
        return sorted(counts.items(), key=lambda kv: -kv[1])[:top]

    return {
        "samples": total - waiting,
        "waiting": waiting,
        "self": ranked(self_counts),
        "inclusive": ranked({k: v for k, v in incl_counts.items() if not k.startswith(_THREAD_FRAMES)}),
        "areas": ranked(areas),
    }


# Leaf frames of a thread that is blocked, not running: left out of the counts (py-spy's own
# idle detection misses waits on locks and TLS reads). ``Handler.acquire``: a logging
# handler's RLock, taken in C: a thread shown there waits for another thread's log line.
_WAITING = (
    "Handler.acquire ",
    "Condition.wait ",
    "Event.wait ",
    "SSLSocket.read ",
    "SSLSocket.recv",
    "_PollLikeSelector.select ",
    "poll_wait_for_socket.",
    "Lock.acquire",
    "sleep ",
    "socket.accept",
)
_THREAD_FRAMES = ("Thread._bootstrap", "Thread.run ", "Thread._bootstrap_inner")
_AREAS = (
    ("json/", "json (de)serialisation"),
    # orjson is C: its time shows in the Python frame that calls it.
    ("decode (kube_gpu_scheduler/kube/jsonio.py", "json (de)serialisation"),
    ("kubernetes/client/api_client", "kubernetes client: models and (de)serialisation"),
    ("kubernetes/client/models", "kubernetes client: models and (de)serialisation"),
    ("kubernetes/", "kubernetes client: other"),
    ("urllib3/", "urllib3 (HTTP)"),
    ("ssl.py", "TLS (ssl)"),
    ("socket.py", "sockets"),
    ("http/client", "http.client"),
    ("logging/", "logging"),
    ("kube_gpu_scheduler/", "kube_gpu_scheduler (map, injection)"),
    ("prometheus_client/", "prometheus_client"),
    ("threading.py", "threading (locks, conditions)"),
    ("queue.py", "threading (locks, conditions)"),
)


# The project's own code, named by module: the scheduler's, and the kube layer it runs on.
_OWN_CODE = ("kube_gpu_scheduler/kube/", "kube_gpu_scheduler/scheduler/")


def _own_module(frame: str) -> str | None:
    for root in _OWN_CODE:
        if root in frame:
            module = frame.split(root, 1)[1].split(".py", 1)[0]
            return f"{root}{module}.py (own code)"
    return None


def area_of(frames: list[str]) -> str:
    """What the leaf frame belongs to; the project's own code names its module."""
    leaf = frames[-1]
    for needle, area in _AREAS:
        if needle in leaf:
            return (_own_module(leaf) or area) if needle == "kube_gpu_scheduler/" else area
    for frame in reversed(frames):
        if own := _own_module(frame):
            return own
    return "other"
