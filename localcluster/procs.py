"""Host processes that must never outlive their owner.

Each process starts in a new session (its own process group), writes its
output to a log file, and is stopped with SIGTERM then SIGKILL sent to the
whole group. Every started process is also registered for an ``atexit``
sweep, so an interrupted test run (Ctrl-C, a failing fixture) still cleans up.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

_LIVE: set[ManagedProcess] = set()

# The Go programs of the local control plane (etcd, kube-apiserver, kube-controller-manager,
# the kubelet, containerd, Argo CD) collect garbage when their heap has grown by GOGC percent
# (100 by default): under the injection policy's 10,000 maps a sixth of kube-apiserver's CPU
# was its collector (a CPU profile). On 2 cores with 24 GiB the local control plane trades
# memory for CPU, a soft limit per process keeping the heaps bounded; the environment's own
# settings win. Python ignores both.
GO_GC_ENV = {"GOGC": "400", "GOMEMLIMIT": "2GiB"}


class ProcessFailed(RuntimeError):
    """A managed process exited or never became ready; carries the log's tail."""


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.env = {**GO_GC_ENV, **(os.environ if env is None else env)}
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"{name}-{os.getpid()}.log"
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.proc.pid

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _LIVE.add(self)
        return self

    def detach(self) -> None:
        """Let the process outlive this interpreter (no atexit sweep); stop it by pid later."""
        _LIVE.discard(self)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self, tail: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text if tail is None else "\n".join(text.splitlines()[-tail:])

    def fail(self, why: str) -> ProcessFailed:
        return ProcessFailed(
            f"{self.name}: {why}\n--- last lines of {self.log_path} ---\n{self.log_text(40)}"
        )

    def wait_http(
        self,
        url: str,
        timeout: float = 60,
        cafile: str | os.PathLike[str] | None = None,
        insecure: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Poll ``url`` until it answers 200; fail early if the process exits."""
        ctx: ssl.SSLContext | None = None
        if url.startswith("https"):
            ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
            if insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.running():
                raise self.fail(
                    f"exited with {self.proc.returncode if self.proc else '?'} before {url} answered"
                )
            try:
                req = urllib.request.Request(url, headers=dict(headers or {}))  # noqa: S310 (loopback only)
                with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except (OSError, ssl.SSLError) as e:
                last = str(e)
            time.sleep(0.2)
        raise self.fail(f"{url} did not answer 200 within {timeout:.0f}s (last: {last})")

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the process group, then SIGKILL what is left; idempotent."""
        _LIVE.discard(self)
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        # The leader may be gone while children linger: sweep the group either way.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def __enter__(self) -> ManagedProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def stop_all() -> None:
    """Stop every process this interpreter started and has not stopped yet."""
    for proc in list(_LIVE):
        proc.stop(timeout=5)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


atexit.register(stop_all)
