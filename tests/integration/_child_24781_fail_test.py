
import json, os, time
def test_child(cluster):
    with open(os.environ["PIDS_FILE"], "w") as f:
        json.dump(cluster.pids(), f)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["GO_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.environ["MODE"] == "fail":
        assert False, "deliberate failure"
    time.sleep(120)
