"""A stand-in pod program for the pod-network tests: an HTTP server on $PORT (at $BIND, else every
address of the pod's network). GET / answers the pod's name; GET /api the status of the API
server's /version as this pod reaches it (KUBERNETES_SERVICE_HOST/PORT, its service-account
token and CA), or the error; GET /resolve/<name> `<seconds> <addresses or the error>` of looking
the name up as the pod's resolver does (its /etc/resolv.conf)."""

import http.server
import os
import socket
import ssl
import time
import urllib.request

SA = "/var/run/secrets/kubernetes.io/serviceaccount"


def api_status() -> str:
    url = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}/version"
    try:
        with open(f"{SA}/token") as fh:
            token = fh.read().strip()
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5, context=ssl.create_default_context(cafile=f"{SA}/ca.crt")) as r:
            return str(r.status)
    except Exception as exc:  # the test shows what the pod saw
        return f"{url}: {exc!r}"


def resolve(name: str) -> str:
    start = time.monotonic()
    try:
        found = " ".join(sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)}))
    except OSError as exc:
        found = f"error {exc}"
    return f"{time.monotonic() - start:.2f} {found}"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/resolve/"):
            body = resolve(self.path.removeprefix("/resolve/")).encode()
        else:
            body = (api_status() if self.path == "/api" else os.environ["POD_NAME"]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


http.server.ThreadingHTTPServer((os.environ.get("BIND", ""), int(os.environ["PORT"])), Handler).serve_forever()
