#!/usr/bin/env python3
"""Build nvlfabric's Go-based tools from pinned Go modules, cached outside the checkout.

Every tool is built by `go build` inside a wrapper module under tools/ (go.mod + go.sum pin the
exact versions). Results land in a per-user cache keyed by tool, pinned version, platform and a
hash of the wrapper's files, so a fresh clone (and CI on the same machine) reuses them:

    ${NVLFABRIC_TOOLS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/nvlfabric/tools}/<tool>-<version>-<os>-<arch>-<hash>/

The checkout gets only links: build/bin/ (every binary, the Pulumi CLI first among them),
build/pulumi-home/plugins/ (the Kubernetes provider and the YAML language host, installed the way
`pulumi plugin install` lays them out) and build/tools.json, the manifest that `nvlfabric-sim` reads.

Only the standard library is used: this runs before the project's virtualenv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parent
REPO = TOOLS_DIR.parent
BUILD = REPO / "build"

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"
PULUMI_VERSION = "v3.260.0"
PULUMI_KUBERNETES_VERSION = "v4.25.0"
# provider/v4 has no tags of its own; this pseudo-version is the commit tagged v4.25.0.
PULUMI_KUBERNETES_PROVIDER_MODULE = "github.com/pulumi/pulumi-kubernetes/provider/v4"
PULUMI_KUBERNETES_PROVIDER_COMMIT = "v4.0.0-20260115033456-f47bc2d6f199"
PULUMI_KUBERNETES_SDK_MODULE = "github.com/pulumi/pulumi-kubernetes/sdk/v4"
# The YAML language host (upstream's server behind our main, tools/pulumi-yaml/cmd): the second
# language consuming the component provider. It builds only against pulumi pkg/sdk v3.206.0, its
# own requirement (see tools/pulumi-yaml/go.mod); a separate main module from the CLI's.
PULUMI_YAML_VERSION = "v1.25.0"
JOBSET_VERSION = "v0.10.1"
LWS_VERSION = "v0.7.0"
KUEUE_VERSION = "v0.14.0"
# A real container runtime for real-kubelet nodes (issue 52): containerd 2.x (CDI on by default),
# runc, and the CNI plugins its CRI plugin calls.
CONTAINERD_VERSION = "v2.4.2"
RUNC_VERSION = "v1.5.3"
CNI_PLUGINS_VERSION = "v1.10.0"
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


def cache_root() -> Path:
    if env := os.environ.get("NVLFABRIC_TOOLS_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nvlfabric" / "tools"


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Never let the go command fetch another toolchain: a too-new module must fail here, clearly.
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOFLAGS", "-mod=readonly")
    return env


def goos_goarch() -> str:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return f"{platform.system().lower()}-{arch}"


def log(msg: str) -> None:
    print(f"[tools] {msg}", flush=True)


class BuildError(Exception):
    """A tool failed to build; the message names the module, the version and the first error."""


@dataclass
class Step:
    """One command of a tool's recipe."""

    what: str
    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=go_env)


@dataclass
class Tool:
    name: str
    module: str  # the Go module whose code is built, for error messages
    version: str
    wrapper: Path
    binaries: list[str]
    recipe: Callable[[Tool, Path], list[Step]]
    extra_inputs: list[Path] = field(default_factory=list)
    assemble: Callable[[Tool, Path], None] | None = None
    """After the build: place what is not a Go binary beside the binaries (in the cache dir)."""

    def key(self) -> str:
        h = hashlib.sha256()
        for path in sorted([*self.wrapper.rglob("*"), *self.extra_inputs]):
            if path.is_file():
                h.update(str(path.relative_to(self.wrapper.parent)).encode())
                h.update(path.read_bytes())
        h.update(RECIPE_REVISION.encode())
        return f"{self.name}-{self.version}-{goos_goarch()}-{h.hexdigest()[:10]}"

    def cache_dir(self) -> Path:
        return cache_root() / self.key()


# Bump when a recipe changes in a way the wrapper files do not show.
RECIPE_REVISION = "2"


def k8s_recipe(tool: Tool, out: Path) -> list[Step]:
    minor = tool.version.split(".")[1]
    stamp = " ".join(
        f"-X {pkg}.{var}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for var in (f"gitVersion={tool.version}", "gitMajor=1", f"gitMinor={minor}", "gitTreeState=clean")
    )
    pkgs = [f"k8s.io/kubernetes/cmd/{b}" for b in tool.binaries]
    return [
        Step(
            f"go build {' '.join(tool.binaries)}",
            ["go", "build", "-trimpath", "-ldflags", f"-s -w {stamp}", "-o", str(out) + "/", *pkgs],
            tool.wrapper,
        )
    ]


def etcd_recipe(tool: Tool, out: Path) -> list[Step]:
    return [Step("go build etcd", ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"),
                                   "./cmd/etcd"], tool.wrapper)]


def kubeletcheck_recipe(tool: Tool, out: Path) -> list[Step]:
    return [Step("go build kubeletcheck", ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o",
                                           str(out / "kubeletcheck"), "."], tool.wrapper)]


def pulumi_recipe(tool: Tool, out: Path) -> list[Step]:
    version_flag = f"-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version={tool.version}"
    env = go_env()
    return [
        Step("go build pulumi", ["go", "build", "-trimpath", "-tags", "osusergo grpcnotrace",
                                 "-ldflags", f"-s -w {version_flag}", "-o", str(out / "pulumi"),
                                 "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"], tool.wrapper, env),
        Step("go build pulumi-language-python pulumi-language-nodejs",
             ["go", "build", "-trimpath", "-ldflags", f"-s -w -X main.version={tool.version}",
              "-o", str(out) + "/", "./cmd/pulumi-language-python", "./cmd/pulumi-language-nodejs"],
             tool.wrapper, env),
    ]


def pulumi_yaml_recipe(tool: Tool, out: Path) -> list[Step]:
    version_flag = f"-X github.com/pulumi/pulumi-yaml/pkg/version.Version={tool.version.removeprefix('v')}"
    return [Step("go build pulumi-language-yaml",
                 ["go", "build", "-trimpath", "-ldflags", f"-s -w {version_flag}", "-o",
                  str(out / "pulumi-language-yaml"), "./cmd/pulumi-language-yaml"],
                 tool.wrapper)]


def pulumi_assemble(tool: Tool, out: Path) -> None:
    """Place the non-Go helpers the official distribution ships beside the CLI for Python."""
    sdk_dir = module_dir("github.com/pulumi/pulumi/sdk/v3", tool.version, tool.wrapper)
    exec_script = out / "pulumi-language-python-exec"
    shutil.copyfile(sdk_dir / "python" / "cmd" / "pulumi-language-python-exec", exec_script)
    exec_script.chmod(0o755)
    # The dynamic-provider plugin: a shell shim that runs pulumi.dynamic in the program's Python.
    shim = out / "pulumi-resource-pulumi-python"
    shutil.copyfile(sdk_dir / "python" / "dist" / "pulumi-resource-pulumi-python", shim)
    shim.chmod(0o755)


def pulumi_kubernetes_recipe(tool: Tool, out: Path) -> list[Step]:
    """Rebuild the provider's repository layout (provider/ beside sdk/) in a writable copy, run its
    generate step (it embeds gitignored files made from the committed schema), then build it as
    its own main module, with its own go.mod and go.sum."""
    src = out.parent / (out.name + ".src")
    if src.exists():
        shutil.rmtree(src)
    provider = module_dir(PULUMI_KUBERNETES_PROVIDER_MODULE, PULUMI_KUBERNETES_PROVIDER_COMMIT, tool.wrapper)
    sdk = module_dir(PULUMI_KUBERNETES_SDK_MODULE, tool.version, tool.wrapper)
    shutil.copytree(provider, src / "provider")
    shutil.copytree(sdk, src / "sdk")
    for path in [src, *src.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    env = go_env()
    env["VERSION"] = tool.version.removeprefix("v")
    cmd_dir = src / "provider" / "cmd" / "pulumi-resource-kubernetes"
    ldflags = f"-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version={tool.version}"
    return [
        Step("go generate (embed the schema)", ["go", "generate", "."], cmd_dir, env),
        Step("go build pulumi-resource-kubernetes",
             ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(out / "pulumi-resource-kubernetes"),
              "./cmd/pulumi-resource-kubernetes"], src / "provider", env),
    ]


def addon_recipe(package: str) -> Callable[[Tool, Path], list[Step]]:
    """An addon's controller manager: its one binary, built from `package` of its module."""
    def recipe(tool: Tool, out: Path) -> list[Step]:
        binary = tool.binaries[0]
        return [Step(f"go build {binary}", ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / binary),
                                           package], tool.wrapper)]
    return recipe


def addon_assemble(config: str) -> Callable[[Tool, Path], None]:
    """The controller's own manifests (CRDs, RBAC, webhooks: the kustomize base at `config` of its
    module), beside its binary: the simulator's addon installs them from there (nvlfabric/sim/addons.py)."""
    def assemble(tool: Tool, out: Path) -> None:
        src = module_dir(tool.module, tool.version, tool.wrapper) / config
        dest = out / f"{tool.name}-config"
        shutil.copytree(src, dest)
        for path in [dest, *dest.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    return assemble


def containerd_recipe(tool: Tool, out: Path) -> list[Step]:
    """containerd, ctr and the runc shim, static (no btrfs snapshotter: it needs cgo and libbtrfs)."""
    pkg = "github.com/containerd/containerd/v2"
    stamp = f"-X {pkg}/version.Version={tool.version} -X {pkg}/version.Package={pkg}"
    return [Step(f"go build {' '.join(tool.binaries)}",
                 ["go", "build", "-trimpath", "-tags", "no_btrfs urfave_cli_no_docs", "-ldflags", f"-s -w {stamp}",
                  "-o", str(out) + "/", *(f"{pkg}/cmd/{b}" for b in tool.binaries)], tool.wrapper)]


def runc_recipe(tool: Tool, out: Path) -> list[Step]:
    """runc needs cgo (its nsenter runs before the Go runtime starts) and, with the `seccomp` tag as a
    node's runc has it, libseccomp (Debian's libseccomp-dev, `make sysdeps`): pods that ask for the
    RuntimeDefault seccomp profile (nvlfabric's controller does) fail to start on a runc without it."""
    if not Path("/usr/include/seccomp.h").is_file():
        raise BuildError("runc: /usr/include/seccomp.h is missing; `make sysdeps` installs Debian's libseccomp-dev")
    env = go_env()
    env["CGO_ENABLED"] = "1"
    return [Step("go build runc (cgo, seccomp)", ["go", "build", "-trimpath", "-tags", "seccomp", "-ldflags",
                                         f"-s -w -X main.version={tool.version.removeprefix('v')}",
                                         "-o", str(out / "runc"), "github.com/opencontainers/runc"], tool.wrapper, env)]


def cni_recipe(tool: Tool, out: Path) -> list[Step]:
    where = {"bridge": "main", "host-local": "ipam", "loopback": "main", "portmap": "meta"}
    return [Step(f"go build {' '.join(tool.binaries)}",
                 ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out) + "/",
                  *(f"{tool.module}/plugins/{where[b]}/{b}" for b in tool.binaries)], tool.wrapper)]


def module_dir(module: str, version: str, wrapper: Path) -> Path:
    """Download a module (checked against the wrapper's go.sum) and return its read-only dir."""
    res = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd=wrapper,
                         env=go_env(), capture_output=True, text=True)
    info = json.loads(res.stdout or "{}")
    if res.returncode != 0 or "Error" in info or "Dir" not in info:
        raise BuildError(f"{module}@{version}: download failed: {info.get('Error') or res.stderr.strip()}")
    return Path(info["Dir"])


TOOLS: list[Tool] = [
    Tool("kubernetes", "k8s.io/kubernetes", KUBERNETES_VERSION, TOOLS_DIR / "kubernetes",
         ["kube-apiserver", "kube-scheduler", "kube-controller-manager"], k8s_recipe),
    # The real kubelet, for nodes of `nvlfabric-sim up --real-kubelets N`: a wrapper of its own (its
    # module graph is larger), so it is built, cached and rebuilt apart from the control plane.
    Tool("kubelet", "k8s.io/kubernetes", KUBERNETES_VERSION, TOOLS_DIR / "kubelet", ["kubelet"], k8s_recipe),
    Tool("etcd", "go.etcd.io/etcd/server/v3", ETCD_VERSION, TOOLS_DIR / "etcd", ["etcd"], etcd_recipe),
    Tool("pulumi", "github.com/pulumi/pulumi/pkg/v3", PULUMI_VERSION, TOOLS_DIR / "pulumi",
         ["pulumi", "pulumi-language-python", "pulumi-language-python-exec", "pulumi-resource-pulumi-python",
          "pulumi-language-nodejs"], pulumi_recipe, assemble=pulumi_assemble),
    Tool("pulumi-kubernetes", PULUMI_KUBERNETES_PROVIDER_MODULE, PULUMI_KUBERNETES_VERSION,
         TOOLS_DIR / "pulumi-kubernetes", ["pulumi-resource-kubernetes"], pulumi_kubernetes_recipe),
    Tool("pulumi-yaml", "github.com/pulumi/pulumi-yaml", PULUMI_YAML_VERSION, TOOLS_DIR / "pulumi-yaml",
         ["pulumi-language-yaml"], pulumi_yaml_recipe),
    # Our wire-compatibility checker, built on the official k8s.io/kubelet generated clients.
    Tool("kubeletcheck", "k8s.io/kubelet", "v0.37.2", TOOLS_DIR / "kubeletcheck", ["kubeletcheck"],
         kubeletcheck_recipe),
    # JobSet's controller manager, for `nvlfabric-sim up --addons jobset`: its own wrapper, since it
    # builds on Kubernetes libraries 0.34 (the control plane is 1.37).
    Tool("jobset", "sigs.k8s.io/jobset", JOBSET_VERSION, TOOLS_DIR / "jobset", ["jobset-manager"],
         addon_recipe("sigs.k8s.io/jobset"), assemble=addon_assemble("config/components")),
    # LeaderWorkerSet's, for `--addons lws`: Kubernetes libraries 0.33, its main package in cmd/,
    # its kustomize base at config/.
    Tool("lws", "sigs.k8s.io/lws", LWS_VERSION, TOOLS_DIR / "lws", ["lws-manager"], addon_recipe("sigs.k8s.io/lws/cmd"),
         assemble=addon_assemble("config")),
    # Kueue's, for `--addons kueue`: Kubernetes libraries 0.34 like JobSet's, but its own module graph.
    Tool("kueue", "sigs.k8s.io/kueue", KUEUE_VERSION, TOOLS_DIR / "kueue", ["kueue-manager"],
         addon_recipe("sigs.k8s.io/kueue/cmd/kueue"), assemble=addon_assemble("config/components")),
    # A real container runtime for real-kubelet nodes: containerd 2.x with its runc shim, runc, and
    # the CNI plugins (wrappers of their own: three module graphs, and runc alone needs cgo).
    Tool("containerd", "github.com/containerd/containerd/v2", CONTAINERD_VERSION, TOOLS_DIR / "containerd",
         ["containerd", "ctr", "containerd-shim-runc-v2"], containerd_recipe),
    Tool("runc", "github.com/opencontainers/runc", RUNC_VERSION, TOOLS_DIR / "runc", ["runc"], runc_recipe),
    Tool("cni-plugins", "github.com/containernetworking/plugins", CNI_PLUGINS_VERSION, TOOLS_DIR / "cni",
         list(CNI_PLUGINS), cni_recipe),
]


def first_error(output: str) -> str:
    """The first line that looks like the cause, not the noise around it."""
    pattern = re.compile(r"(error|cannot|undefined|not found|no required module|invalid|refused|\.go:\d+)", re.I)
    for line in output.splitlines():
        if pattern.search(line) and not line.startswith("go: downloading"):
            return line.strip()
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no output)"


def run_step(tool: Tool, step: Step, logfile: Path) -> int:
    """Run one step, ticking progress every 30 s; returns the step's peak RSS in KiB."""
    start = time.monotonic()
    with logfile.open("a") as fh:
        fh.write(f"$ (cd {step.cwd} && {' '.join(step.argv)})\n")
        fh.flush()
        proc = subprocess.Popen(step.argv, cwd=step.cwd, env=step.env, stdout=fh, stderr=subprocess.STDOUT)
        done = threading.Event()

        def tick() -> None:
            while not done.wait(30):
                log(f"  {tool.name}: {step.what} … {time.monotonic() - start:.0f}s")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        # wait4 reports the largest RSS among the child and the descendants it waited for (the
        # compiler and linker), which is the peak memory figure we report.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
    if proc.returncode != 0:
        output = logfile.read_text()
        raise BuildError(
            f"{tool.name}: building {tool.module} {tool.version} failed at '{step.what}' "
            f"(exit {proc.returncode}): {first_error(output.split('$ (cd ')[-1])}\n"
            f"  full log: {logfile}"
        )
    return int(usage.ru_maxrss)


def build_tool(tool: Tool, *, force: bool) -> dict[str, object]:
    final = tool.cache_dir()
    bindir = final / "bin"
    if not force and all((bindir / b).exists() for b in tool.binaries):
        log(f"{tool.name} {tool.version}: cached ({final})")
        return {"cached": True, "dir": str(bindir)}
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / (final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    (partial / "bin").mkdir(parents=True)
    logfile = partial / "build.log"
    log(f"{tool.name} {tool.version}: building {', '.join(tool.binaries)} from {tool.module}")
    start = time.monotonic()
    peak_kib = 0
    for step in tool.recipe(tool, partial / "bin"):
        peak_kib = max(peak_kib, run_step(tool, step, logfile))
    if tool.assemble is not None:
        tool.assemble(tool, partial / "bin")
    src = partial / "bin.src"
    if src.exists():
        shutil.rmtree(src, ignore_errors=True)
    missing = [b for b in tool.binaries if not (partial / "bin" / b).exists()]
    if missing:
        raise BuildError(f"{tool.name}: build of {tool.module} {tool.version} produced no {', '.join(missing)}")
    seconds = time.monotonic() - start
    stats = {"seconds": round(seconds, 1), "peak_rss_mb": round(peak_kib / 1024)}
    (partial / "build.json").write_text(json.dumps(stats) + "\n")
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    log(f"{tool.name} {tool.version}: built in {seconds:.0f}s, peak RSS {peak_kib / 1024:.0f} MB")
    return {"cached": False, "dir": str(bindir), **stats}


def _relink(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def install_links() -> dict[str, object]:
    """Expose every cached tool to the checkout: build/bin, the plugin cache, the manifest.

    Tools not built yet are listed as missing; `nvlfabric-sim` names them if they are needed.
    """
    bindir = BUILD / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    pulumi_home = BUILD / "pulumi-home"
    present: dict[str, str] = {}
    for tool in TOOLS:
        cached = tool.cache_dir() / "bin"
        if not all((cached / b).exists() for b in tool.binaries):
            continue
        present[tool.name] = str(cached)
        for name in tool.binaries:
            if tool.name == "cni-plugins":
                # A CNI plugin directory of their own (the CRI plugin's bin_dir): `bridge` and
                # `portmap` on PATH would shadow iproute2's `bridge`.
                (BUILD / "cni").mkdir(parents=True, exist_ok=True)
                _relink(BUILD / "cni" / name, cached / name)
            elif name == "pulumi-resource-kubernetes":
                # The engine looks plugins up as $PULUMI_HOME/plugins/resource-<name>-v<version>/;
                # a link is what `pulumi plugin install --file` would copy, without the copy.
                plugin_dir = pulumi_home / "plugins" / f"resource-kubernetes-{tool.version}"
                plugin_dir.mkdir(parents=True, exist_ok=True)
                _relink(plugin_dir / name, cached / name)
            elif name == "pulumi-language-yaml":
                # The CLI finds our Python and Node.js hosts "bundled" beside its own (symlink-
                # resolved) binary, in the pulumi tool's cache dir; the YAML host is in another, and
                # with ambient plugins ignored (the offline env) it must be in the plugin cache.
                # build/bin gets it too, for PATH users.
                plugin_dir = pulumi_home / "plugins" / f"language-yaml-{tool.version}"
                plugin_dir.mkdir(parents=True, exist_ok=True)
                _relink(plugin_dir / name, cached / name)
                _relink(bindir / name, cached / name)
            else:
                _relink(bindir / name, cached / name)
    manifest = {
        "bin_dir": str(bindir),
        "pulumi_home": str(pulumi_home),
        "cni_dir": str(BUILD / "cni"),
        "versions": {t.name: t.version for t in TOOLS},
        "cache_dirs": present,
        "missing": [t.name for t in TOOLS if t.name not in present],
    }
    (BUILD / "tools.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tools", nargs="*", help="only these tools (default: all)")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--print-cache-dir", action="store_true", help="print the cache root and exit")
    args = ap.parse_args(argv)
    if args.print_cache_dir:
        print(cache_root())
        return 0
    if shutil.which("go") is None:
        log("error: the `go` command is not on PATH; install Go 1.26 (the tools are built from Go modules)")
        return 1
    wanted = set(args.tools) or {t.name for t in TOOLS}
    unknown = wanted - {t.name for t in TOOLS}
    if unknown:
        log(f"error: unknown tool(s) {', '.join(sorted(unknown))}; known: {', '.join(t.name for t in TOOLS)}")
        return 2
    start = time.monotonic()
    results: dict[str, dict[str, object]] = {}
    failed: list[str] = []
    for tool in TOOLS:
        if tool.name not in wanted:
            continue
        try:
            results[tool.name] = build_tool(tool, force=args.force)
        except BuildError as exc:
            log(f"FAILED {exc}")
            failed.append(tool.name)
    if failed:
        log(f"{len(failed)} tool(s) failed: {', '.join(failed)}; the others are cached")
        return 1
    install_links()
    log(f"all tools ready in {time.monotonic() - start:.0f}s (cache: {cache_root()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
