"""verify-release's termination message: one line naming each failing replica (what Argo CD
shows for a failed Sync hook), written only into a file that exists."""

from __future__ import annotations

from pathlib import Path

from kube_gpu_scheduler.check.cli import main
from kube_gpu_scheduler.check.results import Result
from kube_gpu_scheduler.check.verify_release import TERMINATION_MESSAGE_LIMIT, failure_summary


def test_the_summary_names_each_failing_replica_and_what_is_wrong() -> None:
    results = [
        Result("node", "node1", "node1", True, "ns/rel-check-0"),
        Result("node", "no-such-node", None, False, "ns/rel-check-1"),
        Result("phase", "Running", "Pending", False, "ns/rel-check-1"),
        Result("replicas", [0, 1], [0], False, "ns/rel-check"),
    ]
    text = failure_summary(results)
    assert "\n" not in text
    assert "rel-check-1: node want no-such-node got None, phase want Running got Pending" in text
    assert "rel-check: replicas want [0, 1] got [0]" in text
    assert "rel-check-0" not in text
    assert failure_summary(results[:1]) == "release matches its maps"


def test_the_summary_fits_a_termination_message() -> None:
    many = [Result("node", "n" * 50, None, False, f"ns/pod-{i}") for i in range(500)]
    assert len(failure_summary(many).encode()) <= TERMINATION_MESSAGE_LIMIT


def test_the_message_goes_only_into_an_existing_file(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # refused at once: nothing listens on port 1
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    message = tmp_path / "termination-log"
    message.write_text("")
    missing = tmp_path / "absent" / "termination-log"
    for path in (message, missing):
        code = main(
            [
                "verify-release",
                "-n",
                "ns",
                "-l",
                "app=x",
                "--timeout",
                "0",
                "--kubeconfig",
                str(kubeconfig),
                "--termination-message-path",
                str(path),
            ]
        )
        assert code == 1
    assert message.read_text().startswith("placement wrong: ")
    assert not missing.exists()
