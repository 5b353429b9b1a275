"""The probe workers: one task per container the kubelet runs as a process, running its probes
(probes.py says how one probe is run and counted) and acting on them: readiness is written to the
pod's status, a failed liveness or startup probe kills the container (restarted as after a crash).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from lightkube import AsyncClient

from nvlfabric.sim.kubelet import podstatus, probes
from nvlfabric.sim.kubelet.events import container_event
from nvlfabric.sim.kubelet.processes import PodProcess
from nvlfabric.sim.kubelet.state import NodeState

__all__ = ["start_prober"]

log = logging.getLogger("nvlfabric.sim.kubelet")

Verdict = Callable[[bool], Awaitable[None]]


def start_prober(client: AsyncClient, state: NodeState, key: tuple[str, str]) -> None:
    """Probe one process container, anew for each instance (a restart starts over)."""
    old = state.probers.pop(key, None)
    if old is not None:
        old.cancel()
    proc = state.processes.get(key)
    if proc is None or not (found := probes.probes_of(proc.container)):
        return
    if "readiness" in found or "startup" in found:
        state.ready[key] = False
    state.probers[key] = asyncio.create_task(_Worker(client, state, key[0], proc, found).run())


class _Worker:
    """One container instance's probes, for as long as it runs."""

    def __init__(self, client: AsyncClient, state: NodeState, uid: str, proc: PodProcess,
                 found: dict[str, probes.Probe]) -> None:
        self.client, self.state, self.uid, self.proc, self.found = client, state, uid, proc, found
        self.ports = {p.name: p.containerPort for p in proc.container.ports or [] if p.name}

    def running(self) -> bool:
        return self.proc.proc.poll() is None

    async def run(self) -> None:
        while self.running():
            try:
                await self._probe()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                # A probe must outlive what breaks it (an API write timing out on a loaded node: the
                # container would never be Ready): say it, and probe afresh, from the startup probe.
                log.exception("probing container %s of pod %s failed; probing it again in 1 s",
                              self.proc.container.name, self.proc.pod_name)
                await asyncio.sleep(1)

    async def _probe(self) -> None:
        """The container's probes as the kubelet runs them: startup first, then readiness and liveness."""
        if (startup := self.found.get("startup")) is not None:
            if not await self._startup(startup):
                return
            if "readiness" not in self.found:
                await self._readiness_changed(True)
        loops = []
        if (readiness := self.found.get("readiness")) is not None:
            loops.append(self._loop(readiness, probes.Counter(passing=False), self._readiness_changed))
        if (liveness := self.found.get("liveness")) is not None:
            loops.append(self._loop(liveness, probes.Counter(passing=True), self._liveness_changed))
        await asyncio.gather(*loops)

    async def _startup(self, startup: probes.Probe) -> bool:
        """Run the startup probe until it passes (True) or its failures kill the container (False)."""
        started = probes.Counter(passing=False)
        counted = probes.Counter(passing=True)  # its failures count towards the kill
        await asyncio.sleep(startup.initial_delay_s)
        while self.running():
            ok = await self._once(startup)
            if started.observe(ok, startup):
                return True
            if counted.observe(ok, startup) is False:
                await self._kill(startup)
                return False
            await asyncio.sleep(startup.period_s)
        return False  # it exited before its startup probe passed: never started, never ready

    async def _loop(self, probe: probes.Probe, counter: probes.Counter, changed: Verdict) -> None:
        await asyncio.sleep(probe.initial_delay_s)
        while self.running():
            verdict = counter.observe(await self._once(probe), probe)
            if verdict is not None:
                await changed(verdict)
            await asyncio.sleep(probe.period_s)

    async def _once(self, probe: probes.Probe) -> bool:
        proc = self.proc
        # Inside the container (its pid from the pid file), not in its shim's (the host's) mount namespace.
        pid = proc.container_pid()
        for _ in range(40):  # a probe's first try can come before the proxy has forked the container
            if pid is not None or probe.spec.exec is None or not self.running():
                break
            await asyncio.sleep(0.05)
            pid = proc.container_pid()
        if pid is None and probe.spec.exec is not None:
            ok, seen = False, "the container's process is not running (yet)"
        else:
            ok, seen = await probes.check(probe, host=self.state.pod_ip(self.uid), ports=self.ports, env=proc.env,
                                          cwd=proc.cwd, enter=pid)
        if not ok:
            await container_event(self.client, proc, "Unhealthy", f"{probe.title} probe failed: {seen}", warning=True)
        return ok

    async def _kill(self, probe: probes.Probe) -> None:
        await container_event(self.client, self.proc, "Killing", f"Container {self.proc.container.name} failed "
                              f"{probe.kind} probe, will be restarted", warning=False)
        self.proc.kill()  # the plugin loop's restart of exited containers restarts it, counting the restart

    async def _readiness_changed(self, ready: bool) -> None:
        self.state.ready[(self.uid, self.proc.container.name)] = ready
        await podstatus.write_ready(self.client, self.state, self.uid)

    async def _liveness_changed(self, alive: bool) -> None:
        if not alive:
            await self._kill(self.found["liveness"])
