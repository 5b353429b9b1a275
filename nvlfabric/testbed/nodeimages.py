"""Container images for the simulator's containerd nodes, built for real and with no registry.

A containerd node (`nvlfabric-sim up --real-kubelets N --runtime containerd`) runs what a cluster
runs: nvlfabric's node image, built from deploy/Dockerfile, and a tiny workload image. Neither can
be pulled here (no registry reaches this machine), so both are made from Debian's packages on it:

1. the base: `mmdebstrap` makes a Debian bookworm root with Python 3.11 and pip (what the public
   `python:3.11-slim` gives the Dockerfile: `python`, `pip`, a pip that may install into the
   system), with this machine's trust store (pip inside the build reaches PyPI the way the host
   does), imported with `buildah from scratch` + `buildah add` + `buildah commit` (Debian's
   buildah 1.28 has no `import`);
2. the node image: `buildah bud deploy/Dockerfile --build-arg BASE=<the base>`, the Dockerfile
   unchanged but for its BASE argument, whose default stays the public image. RUN steps use
   buildah's chroot isolation: this machine has no OCI runtime on buildah's path, and the build
   must not depend on the runc the simulator builds for its nodes;
3. the workload image: Debian's busybox-static alone, its applets linked in /bin;
4. each exported as a docker archive (the tag the pods name, `docker.io/` as containerd spells
   it), imported into each node's containerd by `ctr images import` when the node starts.

Each archive is cached under `$NVLFABRIC_IMAGES_CACHE` (default `~/.cache/nvlfabric/images`) by a
hash of everything it is built from: the base's recipe and this machine's CA certificates, the
Dockerfile and every file it copies (pyproject.toml, README.md, the package). A change to the
package rebuilds the node image (buildah's layer cache keeps the apt and keeper steps); nothing
changed costs a hash of the sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvlfabric.api import names
from nvlfabric.sim import paths

SUITE = "bookworm"
#: What the Dockerfile expects of its base (python:3.11-slim): python and pip on the PATH.
BASE_PACKAGES = ("python3", "python3-pip", "python-is-python3", "ca-certificates")
BASE_REFERENCE = f"localhost/nvlfabric-sim/debian-python:{SUITE}"
#: The certificates this machine trusts beyond Debian's (a proxy's, a company's): the base trusts them too.
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static (make sysdeps)
WORKLOAD_IMAGE = "nvlfabric-sim/busybox:1"
"""The workload image: a static busybox (`sh`, `sleep`, `ls`, `env`...), what test pods on a
containerd node run (`command: [sleep, infinity]` and the like)."""
PAUSE_IMAGE = "localhost/nvlfabric-sim/pause:1"
#: What the Dockerfile copies, besides deploy/Dockerfile itself (its COPY lines).
CONTEXT = ("pyproject.toml", "README.md", "nvlfabric")
IGNORED = ("__pycache__", ".pyc", ".mypy_cache", ".ruff_cache", "venv")
RECIPE_VERSION = "1"  # bump when the steps below change what they make
TICK_S = 30.0

Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """An image could not be built; the message names the step, its log and what to do."""


@dataclass(frozen=True)
class BuiltImage:
    reference: str
    """As the pods name it, normalised as containerd does (`docker.io/...`)."""
    archive: Path
    """A docker archive for `ctr -n k8s.io images import`."""
    size_mb: float
    """The image's size: its archive's, whose layers are uncompressed tars (what the node stores)."""
    cached: bool


def cache_dir() -> Path:
    if env := os.environ.get("NVLFABRIC_IMAGES_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nvlfabric" / "images"


def containerd_reference(reference: str) -> str:
    """`nvlfabric/node-agent:1` → `docker.io/nvlfabric/node-agent:1`, as containerd's CRI names an
    image a pod asks for (a first part without a dot, colon or `localhost` is not a registry)."""
    first, _, rest = reference.partition("/")
    if not rest:
        return f"docker.io/library/{reference}"
    if "." in first or ":" in first or first == "localhost":
        return reference
    return f"docker.io/{reference}"


def _need(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise ImageBuildError(f"`{tool}` is not installed: `make sysdeps` installs Debian's {package}")
    return found


def _run(step: str, argv: list[str], log: Path, progress: Progress, *, cwd: Path | None = None,
         timeout_s: float = 1800.0) -> None:
    """Run one build step into its log, saying every TICK_S what is being built and for how long."""
    started = time.monotonic()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(TICK_S):
            progress(f"  {step} … {time.monotonic() - started:.0f}s")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        with log.open("a") as out:
            out.write(f"\n$ {' '.join(argv)}\n")
            out.flush()
            res = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, timeout=timeout_s,
                                 check=False)
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"{step}: no result in {timeout_s:.0f}s; see {log}") from None
    finally:
        done.set()
    if res.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise ImageBuildError(f"{step} failed (exit {res.returncode}); the end of {log}:\n{tail}")


def _digest(parts: list[bytes], files: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _tree(root: Path, entries: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for entry in entries:
        path = root / entry
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [p for p in candidates if not any(part.endswith(IGNORED) for part in p.relative_to(root).parts)]
    return out


def _host_cas() -> list[Path]:
    return sorted(HOST_CA_DIR.glob("*.crt")) if HOST_CA_DIR.is_dir() else []


def _scratch() -> str:
    """A new buildah working container from nothing; its name."""
    res = subprocess.run(["buildah", "from", "scratch"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ImageBuildError(f"buildah from scratch: {res.stderr.strip()}")
    return res.stdout.strip()


def _from_cache(kind: str, key: str, reference: str) -> BuiltImage | None:
    archive = cache_dir() / f"{kind}-{key}.tar"
    meta = archive.with_suffix(".json")
    if archive.is_file() and meta.is_file():
        return BuiltImage(reference=reference, archive=archive, size_mb=json.loads(meta.read_text())["size_mb"],
                          cached=True)
    return None


def _export(kind: str, key: str, local: str, reference: str, log: Path, progress: Progress) -> BuiltImage:
    """`local` (in buildah's storage) as a docker archive naming `reference`, replacing older ones."""
    archive = cache_dir() / f"{kind}-{key}.tar"
    for old in cache_dir().glob(f"{kind}-*"):
        old.unlink(missing_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    _run(f"exporting {reference}", ["buildah", "push", "-q", local, f"docker-archive:{partial}:{reference}"], log,
         progress)
    size = round(partial.stat().st_size / 2**20, 1)
    archive.with_suffix(".json").write_text(json.dumps({"reference": reference, "size_mb": size}))
    partial.rename(archive)
    return BuiltImage(reference=reference, archive=archive, size_mb=size, cached=False)


def base_image(progress: Progress, log: Path) -> str:
    """The Debian base the Dockerfile builds on (made once per recipe and trust store); its reference."""
    key = _digest([RECIPE_VERSION.encode(), SUITE.encode(), " ".join(BASE_PACKAGES).encode()], _host_cas(),
                  HOST_CA_DIR)
    reference = f"{BASE_REFERENCE}-{key}"
    known = subprocess.run(["buildah", "images", "-q", reference], capture_output=True, text=True, check=False)
    if known.returncode == 0 and known.stdout.strip():
        return reference
    mmdebstrap = _need("mmdebstrap", "mmdebstrap")
    progress(f"building the Debian {SUITE} base image ({', '.join(BASE_PACKAGES)}) with mmdebstrap")
    started = time.monotonic()
    tarball = cache_dir() / f"base-{key}.rootfs.tar"
    # A pip that installs into the system Python, as python:3.11-slim's does (Debian marks its
    # Python externally managed); the machine's extra CAs added to the image's trust store.
    hooks = ['rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED']
    if _host_cas():
        hooks.append(f'cp {HOST_CA_DIR}/*.crt "$1/usr/local/share/ca-certificates/" && '
                     'chroot "$1" update-ca-certificates >/dev/null')
    try:
        _run("mmdebstrap", [mmdebstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                            *[f"--customize-hook={h}" for h in hooks], SUITE, str(tarball)], log, progress)
        container = _scratch()
        try:
            _run("importing the base", ["buildah", "add", "-q", container, str(tarball), "/"], log, progress)
            _run("configuring the base", ["buildah", "config", "--env",
                                          "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                          "--env", "LANG=C.UTF-8", "--cmd", "python3", container], log, progress)
            _run("committing the base", ["buildah", "commit", "-q", container, reference], log, progress)
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    finally:
        tarball.unlink(missing_ok=True)
    progress(f"base image {reference} built in {time.monotonic() - started:.0f}s")
    return reference


def node_image(progress: Progress, repo: Path | None = None) -> BuiltImage:
    """nvlfabric's node image (nvlfabric/node-agent:<release>), built from deploy/Dockerfile."""
    repo = repo or paths.REPO
    dockerfile = repo / "deploy" / "Dockerfile"
    if not dockerfile.is_file():
        raise ImageBuildError(f"no {dockerfile}: containerd nodes run the node image built from deploy/Dockerfile, "
                              "so `--runtime containerd` needs an nvlfabric checkout (the wheel holds no Dockerfile)")
    _need("buildah", "buildah")
    reference = containerd_reference(names.AGENT_IMAGE)
    cache_dir().mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "build.log"
    base = base_image(progress, log)
    key = _digest([RECIPE_VERSION.encode(), base.encode(), reference.encode()],
                  [dockerfile, *_tree(repo, CONTEXT)], repo)
    if (hit := _from_cache("node-agent", key, reference)) is not None:
        return hit
    progress(f"building the node image {reference} from deploy/Dockerfile (buildah bud; log {log})")
    started = time.monotonic()
    local = f"localhost/nvlfabric/node-agent:{key}"
    _run("buildah bud deploy/Dockerfile", [
        "buildah", "bud", "--isolation", "chroot", "--layers", "--build-arg", f"BASE={base}",
        "-f", str(dockerfile), "-t", local, str(repo)], log, progress)
    built = _export("node-agent", key, local, reference, log, progress)
    subprocess.run(["buildah", "rmi", local], capture_output=True, check=False)
    progress(f"node image built in {time.monotonic() - started:.0f}s: {built.size_mb:.0f} MB")
    return built


def workload_image(progress: Progress) -> BuiltImage:
    """The workload pods' image: a static busybox with its applets in /bin."""
    return _busybox_image(progress, "busybox", WORKLOAD_IMAGE, ["--cmd", "sh"])


def pause_image(progress: Progress) -> BuiltImage:
    """The pods' sandbox image (containerd's pinned `sandbox` image; registry.k8s.io/pause cannot be
    pulled here): the busybox image whose shell, as its PID 1, ends on SIGTERM or SIGINT and reaps
    what a pod sharing its process namespace leaves, as the pause program does."""
    pause = "trap 'exit 0' TERM INT; while :; do sleep 86400 & wait $!; done"
    return _busybox_image(progress, "pause", PAUSE_IMAGE, ["--entrypoint", json.dumps(["/bin/sh", "-c", pause]),
                                                           "--cmd", ""])


def _busybox_image(progress: Progress, kind: str, name: str, config: list[str]) -> BuiltImage:
    if not BUSYBOX.is_file():
        raise ImageBuildError(f"{BUSYBOX} is missing: `make sysdeps` installs Debian's busybox-static")
    _need("buildah", "buildah")
    reference = containerd_reference(name)
    cache_dir().mkdir(parents=True, exist_ok=True)
    log = cache_dir() / "build.log"
    key = _digest([RECIPE_VERSION.encode(), reference.encode(), json.dumps(config).encode()], [BUSYBOX],
                  BUSYBOX.parent)
    if (hit := _from_cache(kind, key, reference)) is not None:
        return hit
    progress(f"building the image {reference} from {BUSYBOX}")
    container = _scratch()
    local = f"localhost/nvlfabric-sim/{kind}:{key}"
    try:
        _run("adding busybox", ["buildah", "copy", "-q", container, str(BUSYBOX), "/bin/busybox"], log, progress)
        _run("linking its applets", ["buildah", "run", "--isolation", "chroot", container, "--",
                                     "/bin/busybox", "--install", "-s", "/bin"], log, progress)
        _run("configuring it", ["buildah", "config", "--env", "PATH=/bin", *config, container], log, progress)
        _run("committing it", ["buildah", "commit", "-q", container, local], log, progress)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    built = _export(kind, key, local, reference, log, progress)
    subprocess.run(["buildah", "rmi", local], capture_output=True, check=False)
    return built
