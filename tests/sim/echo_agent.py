"""A stand-in "container" for the simulated kubelet's local-process pods: reports what it sees.

It writes its environment, arguments and the service-account files it can read to
$HOME/report.json (HOME is the pod's directory), then idles until SIGTERM.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

sa_dir = Path(os.environ.get("SA_DIR", "/nonexistent"))
report = {
    "env": dict(os.environ),
    "args": sys.argv[1:],
    "pid": os.getpid(),
    "instance": os.urandom(8).hex(),  # (its pid is the same in each instance's own PID namespace)
    "token": (sa_dir / "token").read_text() if (sa_dir / "token").exists() else None,
    "namespace": (sa_dir / "namespace").read_text() if (sa_dir / "namespace").exists() else None,
    "ca": (sa_dir / "ca.crt").exists(),
    # What the container sees at its volumes' mount paths, and its /etc/hosts.
    "kubelet_root": sorted(os.listdir("/var/lib/kubelet")) if os.path.isdir("/var/lib/kubelet") else None,
    "hosts": Path("/etc/hosts").read_text(),
    "cwd": os.getcwd(),
}
out = Path(os.environ["HOME"]) / "report.json"
tmp = out.with_suffix(".tmp")
tmp.write_text(json.dumps(report))
tmp.replace(out)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
