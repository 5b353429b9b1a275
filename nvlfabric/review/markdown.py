"""The report as Markdown for a pull-request comment: a summary line, then tables a reviewer scans
(domains, workloads, racks), then the components' warnings. Only what changes is listed."""

from __future__ import annotations

from nvlfabric.api.names import GPUS_PER_NODE
from nvlfabric.review.impact import Report

MAX_OTHERS = 12
"""Other resources listed one by one (a first install creates dozens of the driver's)."""
OP_MARK = {"create": "+ create", "update": "~ update", "replace": "+- replace", "delete": "- delete"}


def _n(value: int | None, unknown: str = "?") -> str:
    return unknown if value is None else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(report: Report, *, title: str = "nvlfabric preview") -> str:
    lines = [f"### {title}", ""]
    summary = ", ".join(f"{n} to {op}" for op, n in sorted(report.summary.items()) if n) or "no changes"
    disrupted = sum(d.running or 0 for d in report.domains) + sum(
        w.running or 0 for w in report.workloads if not any(d.ref == w.ref for d in report.domains))
    lines.append(f"**{summary}**" + (f"; **{disrupted} running pods disrupted**" if disrupted else ""))
    if not report.cluster_known:
        lines.append("")
        lines.append("_The cluster was not read: running pods and free GPUs are unknown (?)._")
    if report.errors:
        lines += ["", "**Errors**", ""]
        lines += [f"- {_cell(who + ': ' if who else '')}{_cell(msg)}" for who, msg in report.errors]
    if report.domains:
        lines += ["", "| ComputeDomain | change | why | running pods losing their channel |", "|---|---|---|---|"]
        for d in report.domains:
            why = ", ".join(d.reasons) or ("new" if d.op == "create" else "removed" if d.op == "delete" else "")
            running = _n(d.running) if d.op in ("replace", "delete") else ""
            lines.append(f"| `{d.ref}` | {OP_MARK.get(d.op, d.op)} | {_cell(why)} | {running} |")
    if report.workloads:
        lines += ["", "| workload | change | pods | GPUs | running pods stopped |", "|---|---|---|---|---|"]
        for w in report.workloads:
            running = _n(w.running) if w.op in ("replace", "delete") else ""
            lines.append(f"| {w.kind} `{w.ref}` | {OP_MARK.get(w.op, w.op)} | {w.pods} | {w.gpus} | {running} |")
    if report.others:
        shown = report.others[:MAX_OTHERS]
        lines += ["", "| other resource | change | what changes |", "|---|---|---|"]
        lines += [f"| {_cell(o.what)} | {OP_MARK.get(o.op, o.op)} | {_cell(', '.join(o.reasons))} |" for o in shown]
        if len(report.others) > len(shown):
            lines.append(f"| … and {len(report.others) - len(shown)} more | | |")
    spares_changed = any(r.spares_before is not None for r in report.racks)
    if report.racks and (report.asked_gpus or spares_changed
                         or any(w.op in ("create", "replace") for w in report.workloads)):
        total_free = sum(r.free_gpus for r in report.racks if r.free_gpus is not None)
        known = all(r.free_gpus is not None for r in report.racks)
        # The spares column only where a rack has or had some: a fleet without spares reads as before.
        with_spares = spares_changed or any(r.spares for r in report.racks)
        lines += ["", f"GPUs asked by new or replaced workloads: **{report.asked_gpus}**, free on the racks: "
                      f"**{total_free if known else '?'}**", "",
                  "| rack | nodes | GPUs | free GPUs |" + (" spare nodes |" if with_spares else ""),
                  "|---|---|---|---|" + ("---|" if with_spares else "")]
        for r in report.racks:
            spares = (f" {r.spares_before} → {r.spares} |" if r.spares_before is not None else f" {r.spares} |") \
                if with_spares else ""
            lines.append(f"| {r.name} | {r.nodes} | {_n(r.gpus)} | {_n(r.free_gpus)} |{spares}")
        if with_spares:
            lines += ["", "_Spare nodes (nvlfabric.io/spares) are kept free for replacements of running "
                          "ComputeDomains' lost members: no new domain is placed on them, so of the free GPUs, "
                          f"{GPUS_PER_NODE} per spare node are not for new workloads._"]
    if report.warnings:
        lines += ["", "**Warnings**", ""]
        lines += [f"- {_cell(who + ': ' if who else '')}{_cell(msg)}" for who, msg in report.warnings]
    return "\n".join(lines) + "\n"
