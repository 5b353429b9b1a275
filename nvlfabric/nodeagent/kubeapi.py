"""The node agent's Kubernetes API client: the handful of calls it makes, on the standard library.

Why not lightkube (which the provider and the controller use): the agent runs on every GPU node
and its memory budget is 60 MB; lightkube with httpx and its generated models costs ~10 MB of it
for seven REST calls. Objects here are plain JSON dicts; what the agent reads from them is
validated where it is read (driver.py), and what it writes is built from pydantic models.

One keep-alive HTTPS connection, guarded by a lock (the agent's calls are few and serialised),
reopened once when the server closed it. A 429 or 5xx answer is tried again up to three times
(`RETRY_DELAYS_S`, or the server's Retry-After), then raised as its `nvlfabric.api.errors` class.
Service-account tokens are re-read when the file changes: projected tokens are rotated by the
kubelet.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from nvlfabric.api import errors

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: server-side apply takes a JSON body
TIMEOUT_S = 20.0
RETRY_DELAYS_S = (0.25, 0.5, 1.0)
"""Waits before the second, third and fourth try of a request the server answered 429 or 5xx: the
API server throttling the agent (priority and fairness) or something behind it failing briefly. A
prepare has the kubelet's names.KUBELET_PREPARE_TIMEOUT_S (45 s); these add at most 1.75 s unless the
server asks for more."""
MAX_RETRY_AFTER_S = 5.0
"""The longest `Retry-After` honoured per wait, so a throttled agent still answers the kubelet in time."""


def retry_delay(exc: errors.ApiStatusError, default_s: float) -> float:
    """How long to wait before trying again: the server's Retry-After when it gave one, capped."""
    return min(exc.delay_s if exc.delay_s is not None else default_s, MAX_RETRY_AFTER_S)


class ConfigError(Exception):
    """The credentials are unusable; the message names the file and the field."""


@dataclass(frozen=True)
class Config:
    server: str
    ssl_context: ssl.SSLContext | None
    token: str | None = None
    token_file: Path | None = None


def _data_file(data: str, suffix: str) -> str:
    """Write base64 `*-data` to a private temp file (ssl loads certificates only from files)."""
    fd, name = tempfile.mkstemp(prefix="nvlfabric-kube-", suffix=suffix)
    with os.fdopen(fd, "wb") as fh:
        fh.write(base64.b64decode(data))
    return name


def _context(ca_file: str | None, ca_data: str | None, cert: tuple[str | None, str | None],
             cert_data: tuple[str | None, str | None], insecure: bool) -> ssl.SSLContext:
    # Trust the cluster's CA only, when there is one: the system bundle is not needed (and holds
    # ~1 MB of certificates in memory).
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT) if (ca_file or ca_data) and not insecure \
        else ssl.create_default_context()
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_data:
        ctx.load_verify_locations(cadata=base64.b64decode(ca_data).decode())
    elif ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    cert_file, key_file = cert
    if cert_data[0] and cert_data[1]:
        cert_file, key_file = _data_file(cert_data[0], ".crt"), _data_file(cert_data[1], ".key")
        try:
            ctx.load_cert_chain(cert_file, key_file)
        finally:
            os.unlink(cert_file)
            os.unlink(key_file)
    elif cert_file and key_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def from_kubeconfig(path: str | Path) -> Config:
    """The current context of a kubeconfig file (server, CA, token or client certificate)."""
    import yaml  # only here: in a cluster the agent uses its service account, and never pays for it

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"kubeconfig {path}: cannot read it: {exc}") from exc

    def named(kind: str, name: str) -> JSON:
        for item in doc.get(f"{kind}s") or []:
            if item.get("name") == name:
                return dict(item.get(kind) or {})
        raise ConfigError(f"kubeconfig {path}: no {kind} named {name!r} "
                          f"(current-context {doc.get('current-context')!r})")

    current = doc.get("current-context") or ((doc.get("contexts") or [{}])[0].get("name"))
    if not current:
        raise ConfigError(f"kubeconfig {path}: no current-context and no contexts")
    ctx = named("context", current)
    cluster, user = named("cluster", ctx.get("cluster", "")), named("user", ctx.get("user", ""))
    server = cluster.get("server")
    if not server:
        raise ConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")

    def rel(p: str | None) -> str | None:
        return str((path.parent / p).resolve()) if p else None

    ssl_ctx = None
    if server.startswith("https://"):
        ssl_ctx = _context(rel(cluster.get("certificate-authority")), cluster.get("certificate-authority-data"),
                           (rel(user.get("client-certificate")), rel(user.get("client-key"))),
                           (user.get("client-certificate-data"), user.get("client-key-data")),
                           bool(cluster.get("insecure-skip-tls-verify")))
    token_file = rel(user.get("tokenFile"))
    return Config(server=server, ssl_context=ssl_ctx, token=user.get("token"),
                  token_file=Path(token_file) if token_file else None)


def from_service_account(directory: str | Path) -> Config:
    """In-cluster: the pod's projected token and CA, the API server from the service env vars."""
    directory = Path(directory)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("in-cluster config needs $KUBERNETES_SERVICE_HOST (set by the kubelet); "
                          "outside a cluster pass --kubeconfig")
    if not (directory / "token").exists():
        raise ConfigError(f"service account token {directory / 'token'} does not exist; "
                          "is automountServiceAccountToken off?")
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    ca = directory / "ca.crt"
    ssl_ctx = _context(str(ca) if ca.exists() else None, None, (None, None), (None, None), False)
    return Config(server=f"https://{netloc}", ssl_context=ssl_ctx, token_file=directory / "token")


class Client:
    """JSON over one persistent connection. Paths are API paths (`/api/v1/nodes/x`)."""

    def __init__(self, config: Config, *, field_manager: str) -> None:
        self.config = config
        self.field_manager = field_manager
        url = urlsplit(config.server)
        self._host, self._port = url.hostname or "localhost", url.port
        self._prefix = url.path.rstrip("/")
        self._https = url.scheme == "https"
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._token: tuple[float, str] | None = None
        self.sleep: Callable[[float], None] = time.sleep  # between retries; tests record it

    def _bearer(self) -> str | None:
        if self.config.token_file is None:
            return self.config.token
        mtime = self.config.token_file.stat().st_mtime
        if self._token is None or self._token[0] != mtime:
            self._token = (mtime, self.config.token_file.read_text().strip())
        return self._token[1]

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=TIMEOUT_S,
                                               context=self.config.ssl_context)
        return http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S)

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                query: dict[str, str] | None = None) -> JSON:
        url = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "User-Agent": "nvlfabric-agent"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if token := self._bearer():
            headers["Authorization"] = f"Bearer {token}"
        for delay in (*RETRY_DELAYS_S, None):
            try:
                return self._send(method, path, url, data, headers)
            except (errors.TooManyRequests, errors.ServerError) as exc:
                if delay is None:
                    raise
                self.sleep(retry_delay(exc, delay))
        raise AssertionError("unreachable: the last try returns or raises")

    def _send(self, method: str, path: str, url: str, data: bytes | None, headers: dict[str, str]) -> JSON:
        with self._lock:
            for attempt in (1, 2):
                if self._conn is None:
                    self._conn = self._connect()
                try:
                    self._conn.request(method, url, body=data, headers=headers)
                    resp = self._conn.getresponse()
                    raw = resp.read()
                    break
                except (http.client.RemoteDisconnected, http.client.CannotSendRequest, BrokenPipeError,
                        ConnectionResetError) as exc:
                    # An idle keep-alive connection the server closed: once more on a fresh one.
                    self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise OSError(f"API server {self.config.server}: {exc}") from exc
                except OSError:
                    self._conn.close()
                    self._conn = None
                    raise
        if resp.status >= 400:
            # The same classes lightkube's errors become (nvlfabric.api.errors): callers match types.
            action = f"{method} {path}"
            try:
                status = json.loads(raw)
            except ValueError:
                status = None
            if not isinstance(status, dict) or status.get("kind") != "Status":
                raise errors.not_a_status(action=action, code=resp.status, reason=resp.reason)
            raise errors.from_status(status, action=action, code=resp.status)
        return json.loads(raw) if raw else {}

    # -- the verbs the agent uses ---------------------------------------------------------------

    def get(self, path: str) -> JSON:
        return self.request("GET", path)

    def list(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None) -> list[JSON]:
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v} or None
        items: list[JSON] = []
        while True:
            page = self.request("GET", path, query=query)
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items
            query = {**(query or {}), "continue": cont}

    def create(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body, query={"fieldManager": self.field_manager})

    def patch(self, path: str, body: JSON, *, content_type: str = MERGE_PATCH) -> JSON:
        return self.request("PATCH", path, body, content_type=content_type,
                            query={"fieldManager": self.field_manager})

    def delete(self, path: str) -> JSON:
        return self.request("DELETE", path)

    def apply(self, path: str, body: JSON, *, field_manager: str | None = None, force: bool = True) -> JSON:
        """Server-side apply under `field_manager` (default: this client's)."""
        query = {"fieldManager": field_manager or self.field_manager, "force": "true" if force else "false"}
        return self.request("PATCH", path, body, content_type=APPLY_PATCH, query=query)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def path(group_version: str, plural: str, name: str | None = None, *, namespace: str | None = None,
         subresource: str | None = None) -> str:
    """The REST path of a collection or object (`v1` is the core group)."""
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{quote(name, safe='')}"
    if subresource:
        base += f"/{subresource}"
    return base
