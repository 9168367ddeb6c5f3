"""Machine facts for reports and the baseline name (nproc, RAM, CPU model, page cache)."""

from __future__ import annotations

import os
import platform
import re


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def facts() -> dict[str, object]:
    mem = _meminfo()
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": round(mem.get("MemTotal", 0) / 2**30, 1),
        "page_cache_gib": round(mem.get("Cached", 0) / 2**30, 2),
        "mem_available_gib": round(mem.get("MemAvailable", 0) / 2**30, 1),
        "cpu": cpu_model(),
        "platform": platform.platform(),
    }


def name() -> str:
    """A stable, machine-ish name: ``<cpu-family>-<n>c-<ram>g`` (e.g. ``intel-xeon-2c-24g``)."""
    f = facts()
    cpu = re.sub(r"\(.*?\)|cpu|processor|@.*", " ", str(f["cpu"]).lower())
    words = [w for w in re.split(r"[^a-z0-9]+", cpu) if w][:2] or ["cpu"]
    ram = round(float(f["ram_gib"]))
    return f"{'-'.join(words)}-{f['nproc']}c-{ram}g"


def resident_fraction(paths) -> float | None:
    """Fraction of the files' bytes in the page cache (util-linux ``fincore``), or None without it."""
    import shutil
    import subprocess

    files = [str(p) for p in paths]
    if not files or shutil.which("fincore") is None:
        return None
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", *files],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    res = size = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            res, size = res + int(parts[0]), size + int(parts[1])
    return res / size if size else None
