"""`python -m nvlfabric.sim.cri.machine SETTINGS`: one simulated node run by the real kubelet.

Started by the simulator inside the node's machine (its own PID namespace, and a mount namespace
whose root is the host's file system with the node's directories at /var/lib/kubelet, /etc/cdi,
/var/run/cdi, /run/nvidia/driver, its /proc/devices, GPU device nodes and the kernel tunables the
kubelet writes: see nvlfabric/sim/realnode.py). Here it serves the CRI stand-in (runtime.py),
then runs the kubelet against it and supervises both: SIGTERM stops the kubelet, then every
container, then the runtime. The kubelet exiting on its own ends the node (its log says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from pydantic import BaseModel

from nvlfabric.sim.cri.runtime import RuntimeSettings, serve

log = logging.getLogger("nvlfabric.sim.cri")
KUBELET_STOP_TIMEOUT_S = 20.0


class MachineSettings(BaseModel):
    node: str
    runtime: RuntimeSettings
    kubelet_argv: list[str]
    kubelet_log: Path
    kubelet_cwd: Path
    """An empty scratch directory: the kubelet deletes files matching a container's log path
    pattern in its working directory when a runtime reports an empty one (never a checkout)."""


async def run(settings: MachineSettings) -> int:
    server, runtime = await serve(settings.runtime)
    log.info("node %s: CRI served on %s", settings.node, settings.runtime.socket)
    settings.kubelet_cwd.mkdir(parents=True, exist_ok=True)
    settings.kubelet_log.parent.mkdir(parents=True, exist_ok=True)
    with settings.kubelet_log.open("ab") as out:
        kubelet = await asyncio.create_subprocess_exec(*settings.kubelet_argv, stdin=asyncio.subprocess.DEVNULL,
                                                       stdout=out, stderr=out, cwd=settings.kubelet_cwd)
    log.info("node %s: kubelet started (pid %d), log %s", settings.node, kubelet.pid, settings.kubelet_log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    exited = asyncio.create_task(kubelet.wait())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if exited.done():
        code = exited.result() or 1
        log.error("node %s: the kubelet exited (%s); see %s", settings.node, code, settings.kubelet_log)
    else:
        kubelet.terminate()
        try:
            await asyncio.wait_for(exited, KUBELET_STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                kubelet.kill()
            await exited
    stopping.cancel()
    await runtime.stop_all()
    await server.stop(1)
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = MachineSettings.model_validate_json(Path(args[0]).read_text())
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
