"""The API server stopped for 20 s in the middle of `pulumi up`: that `pulumi up` rides it out, the
next one converges, `pulumi refresh` finds nothing changed, nothing is left over (one
ComputeDomain and one channel claim, owned by it, both the stack's), and the domain goes Ready
with the Job's pods running.

The stack is tests/fixtures/outage_stack: the dev stack's path (driver + rack + ComputeDomain +
BoundJob) at its smallest, on a simulated rack of two nodes; stacks/dev itself needs 36 nodes.

The outage starts at the worst moment for the domain, the same in every run: its ComputeDomain
exists and the create of its channel claim is under way. An admission webhook of the test's holds
that create in the API server until the server is stopped (a webhook registered for channel
claims only, answering "allowed" to every later request). Before the provider tried again after
temporary errors, the create failed there, its roll-back could not reach the server either, and
the ComputeDomain left behind failed every later `pulumi up` with ObjectExists."""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api import names
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim import pki
from nvlfabric.sim.cluster import eventually, ready_domain_status
from nvlfabric.testbed.controlplane import ControlPlane
from nvlfabric.testbed.pulumi_cli import project_from_fixture
from tests.conftest import free_ports, simulated_rack

pytestmark = [pytest.mark.cluster, pytest.mark.pulumi]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "outage_stack"
RACK = 170  # addresses 127.10.170.x: away from a demo's racks and the other e2e tests'
OUTAGE_S = 20.0


@pytest.fixture(scope="module")
def rack() -> Iterator[tuple[ControlPlane, Client]]:
    with simulated_rack(ports=free_ports(), first_rack=RACK, nodes=2, field_manager="outage-test",
                        prefix="nvlout-") as sim:
        yield sim


class Hold:
    """An HTTPS admission webhook that holds the first request until `release`, and allows all."""

    def __init__(self, tls_dir: Path) -> None:
        pki.generate(tls_dir)  # a CA and a serving certificate for 127.0.0.1
        self.ca = (tls_dir / "ca.crt").read_bytes()
        self.arrived, self.released = threading.Event(), threading.Event()
        hold = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not hold.arrived.is_set():
                    hold.arrived.set()
                    hold.released.wait(60)
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
                    "uid": review["request"]["uid"], "allowed": True}}).encode()
                with contextlib.suppress(OSError):  # the API server that asked may be gone
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls_dir / "apiserver.crt", tls_dir / "apiserver.key")
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def configuration(self, name: str) -> ValidatingWebhookConfiguration:
        return ValidatingWebhookConfiguration.from_dict({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "hold.outage-test.nvlfabric.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Ignore", "timeoutSeconds": 30,
                "clientConfig": {"url": f"https://127.0.0.1:{self.server.server_port}/",
                                 "caBundle": base64.b64encode(self.ca).decode()},
                "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE"],
                           "resources": ["resourceclaims"]}],
                # channel claims only: the ones the ComputeDomain provider creates
                "objectSelector": {"matchExpressions": [{"key": names.COMPUTE_DOMAIN_LABEL,
                                                         "operator": "Exists"}]}}]})

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def test_pulumi_up_rides_out_a_20_s_api_server_outage_and_leaves_nothing_behind(
        rack: tuple[ControlPlane, Client], tmp_path: Path) -> None:
    cp, client = rack
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    proj.run("config", "set", "nodes", ",".join(n.name for n in cp.nodes()))
    proj.run("config", "set", "rack", f"rack-{RACK}")
    hold = Hold(tmp_path / "tls")
    client.create(hold.configuration("outage-test-hold"))

    started = time.monotonic()
    first = subprocess.Popen(["pulumi", "up", "--yes", "--skip-preview"], cwd=proj.workdir, env=proj.env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert hold.arrived.wait(240), "the channel claim's create never reached the API server"
        cp.stop_apiserver()
        down = time.monotonic()
        hold.released.set()
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
        cp.start_apiserver()
        back = time.monotonic()
        out, _ = first.communicate(timeout=600)
    finally:
        hold.close()
        if first.poll() is None:
            first.kill()
            first.communicate()
    print(f"outage {down - started:.1f} s into `pulumi up`, {back - down:.1f} s long; that `pulumi up` exited "
          f"{first.returncode} after {time.monotonic() - started:.1f} s\n--- its output\n{out}")
    assert first.returncode == 0, "the `pulumi up` the outage hit failed"
    client.delete(ValidatingWebhookConfiguration, "outage-test-hold")

    t0 = time.monotonic()
    again = proj.run("up", "--yes", "--skip-preview", timeout=300)
    print(f"`pulumi up` after the outage: {time.monotonic() - t0:.1f} s\n{again.stdout}")
    refresh = proj.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", check=False, timeout=300)
    assert refresh.returncode == 0, f"`pulumi refresh` found changes:\n{refresh.stdout}\n{refresh.stderr}"

    # Nothing left over: the stack's one domain, and one claim, the domain's.
    state = proj.json("stack", "export")["deployment"]
    assert not state.get("pending_operations"), state["pending_operations"]
    (domain,) = [r["outputs"] for r in state["resources"] if r["type"].endswith("dynamic/nvlfabric:ComputeDomain")]
    domains = [(cd.metadata.name, cd.metadata.uid) for cd in client.list(ComputeDomainResource, namespace="*")]
    assert domains == [(domain["name"], domain["uid"])], domains
    claims = [(c.metadata.name, [o.uid for o in c.metadata.ownerReferences or []])
              for c in client.list(ResourceClaim, namespace="*")]
    assert claims == [(domain["claim_name"], [domain["uid"]])], claims

    # ... and it works: the domain goes Ready with the Job's pods running on both nodes.
    ready_domain_status(client, domain["name"], timeout=120)
    job = proj.json("stack", "output", "--json")["job"]
    eventually("the Job's pods to run", lambda: len([
        p for p in client.list(Pod, namespace="default", labels={"batch.kubernetes.io/job-name": job})
        if p.status and p.status.phase == "Running"]) == 2, timeout=60)
