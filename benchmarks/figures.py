"""Figures from a pytest-benchmark JSON (``--benchmark-json``): per-loader numbers, ratios and the issue's targets.

Shared by ``benchmarks.compare`` (the regression gate) and
``benchmarks.report`` (REPORT.md and plots). Times are the median of the
rounds; throughputs are ``tokens / median``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The targets (checked in the report; the regression gate uses the baselines).
TARGET_RESUME_FLAT = 1.5        # impl resume p90 / p0 at >= 1M documents
TARGET_TPUT_FRACTION = 0.5      # impl single-process tokens/s / raw gather tokens/s
TARGET_RESUME_SECONDS = 2e-3    # impl-fresh: open -> dataset -> loader -> load_state_dict -> first batch, >= 1M documents
TARGET_CONSTRUCT_SECONDS = 2e-3  # PackedDataset(...) + len on an opened store, plan cache warm
TARGET_MIX_TPUT_FRACTION = 0.9   # a 2- or 4-source mixture's tokens/s / one PackedDataset's (issue 10)
TARGET_FIRST_READ_CHECKS = 0.05  # block checks of a first read / the packed iteration they guard (no shuffle), at L


def load(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


@dataclass
class Row:
    name: str
    group: str
    median: float
    min: float
    rounds: int
    extra: dict[str, Any]

    @property
    def tokens_per_s(self) -> float | None:
        t = self.extra.get("tokens")
        return t / self.median if t and self.median > 0 else None

    @property
    def items_per_s(self) -> float | None:
        n = self.extra.get("samples")
        return n / self.median if n and self.median > 0 else None


def rows(data: dict[str, Any]) -> list[Row]:
    out = []
    for b in data.get("benchmarks", []):
        st = b.get("stats") or {}
        out.append(Row(name=b["param"] if b.get("param") else b["name"], group=b.get("group") or "",
                       median=float(st.get("median", 0.0)), min=float(st.get("min", 0.0)),
                       rounds=int(st.get("rounds", 0)), extra=b.get("extra_info") or {}))
    return out


def by_name(data: dict[str, Any]) -> dict[str, Row]:
    return {r.name: r for r in rows(data)}


def loadspec_info(data: dict[str, Any]) -> dict[str, Any]:
    return (data.get("machine_info") or {}).get("loadspec") or {}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def ratios(data: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """Gate figures: ``name -> (value, "higher" | "lower")`` (which direction is better).

    Only ratios to something measured in the same run: the raw-gather limit,
    impl itself at another position/size, or a peer on the same corpus.
    """
    r = by_name(data)
    out: dict[str, tuple[float, str]] = {}

    def put(name: str, value: float | None, better: str) -> None:
        if value is not None:
            out[name] = (value, better)

    for shuffle in ("none", "global"):
        raw, floor = r.get(f"tput-raw-{shuffle}-w0"), r.get(f"tput-floor-{shuffle}-w0")
        for w in (0, 2):
            impl = r.get(f"tput-impl-{shuffle}-w{w}")
            if impl and raw:
                put(f"tput impl/raw ({shuffle}, {w} workers)", _ratio(impl.tokens_per_s, raw.tokens_per_s), "higher")
            if impl and floor and w == 0:
                put(f"tput impl/floor ({shuffle}, 0 workers)", _ratio(impl.tokens_per_s, floor.tokens_per_s), "higher")
    for loader in ("impl", "impl-fresh"):
        p0 = r.get(f"resume-{loader}-p00")
        for pos in ("p50", "p90"):
            p = r.get(f"resume-{loader}-{pos}")
            if p and p0:
                put(f"resume {loader} {pos}/p0", _ratio(p.median, p0.median), "lower")
    opens = {row.extra.get("size"): row for row in r.values() if row.name.startswith("open-impl-")
             and row.extra.get("loader") == "impl"}
    size = loadspec_info(data).get("size")
    here = opens.get(size)
    for row in r.values():
        if row.extra.get("kind") == "construct" and here is not None:
            put(f"construct {row.extra['packing']}-{row.extra['shuffle']} / open impl", _ratio(row.median, here.median),
                "lower")
    fresh = r.get("resume-impl-fresh-p90")
    if fresh and here is not None:
        put("resume impl-fresh p90 / open impl", _ratio(fresh.median, here.median), "lower")
    if "S" in opens:
        for size in ("M", "L"):
            if size in opens:
                put(f"open impl {size}/S", _ratio(opens[size].median, opens["S"].median), "lower")
    mix_ratios(r, here, put)
    for shuffle in ("none", "global"):
        pair = r.get(f"impl-first-vs-verified-{shuffle}")
        if pair and "first_read_overhead" in pair.extra:
            put(f"integrity first-read overhead ({shuffle})", 1 + float(pair.extra["first_read_overhead"]), "lower")
    for row in r.values():
        if row.extra.get("kind") == "build-vs-raw" and "ratio" in row.extra:
            put(f"build impl/raw encode tokens/s ({row.extra['num_proc']} proc)", float(row.extra["ratio"]), "higher")
        if row.extra.get("kind") == "build-tasks-vs-raw" and "ratio" in row.extra:
            put(f"build tasks/raw encode tokens/s ({row.extra['tasks']} tasks)", float(row.extra["ratio"]), "higher")
    b_impl, b_hf = r.get("build-impl-p2"), r.get("build-hf-map-p2")
    if b_impl and b_hf:
        put("build impl/hf-map tokens/s", _ratio(b_impl.tokens_per_s, b_hf.tokens_per_s), "higher")
    for row in r.values():
        if row.extra.get("kind") == "packing" and "utilisation" in row.extra:
            put(f"packing utilisation {row.extra['mode']}", float(row.extra["utilisation"]), "higher")
    return out


def mixing_rows(r: dict[str, Row], kind: str) -> dict[int, Row]:
    """``test_mixing.py``'s rows of ``kind`` by source count (1: the single dataset), for one position if resume."""
    return {int(row.extra["sources"]): row for row in r.values() if row.extra.get("kind") == kind}


def mixing_resume(r: dict[str, Row]) -> dict[tuple[int, float], Row]:
    return {(int(row.extra["sources"]), float(row.extra["position"])): row for row in r.values()
            if row.extra.get("kind") == "mixing-resume"}


def mix_ratios(r: dict[str, Row], open_row: Row | None, put: Any) -> None:
    """Mixtures (issue 10): tokens/s over one PackedDataset's, resume p50/p0 and p90/p0, plan build over a warm open."""
    tput = mixing_rows(r, "mixing-throughput")
    single = tput.get(1)
    for k, row in sorted(tput.items()):
        if k > 1 and single is not None:
            put(f"tput mixing {k} sources / single dataset", _ratio(row.tokens_per_s, single.tokens_per_s), "higher")
    res = mixing_resume(r)
    for (k, pos), row in sorted(res.items()):
        p0 = res.get((k, 0.0))
        if pos > 0 and p0 is not None:
            put(f"resume mixing {k} sources p{round(pos * 100):02d}/p0", _ratio(row.median, p0.median), "lower")
    if open_row is not None:
        for k, row in sorted(mixing_rows(r, "mixing-plan").items()):
            put(f"mixing plan {k} sources / open impl", _ratio(row.median, open_row.median), "lower")


# Per-figure tolerance of the regression gate (relative). Noisy figures get more room.
TOLERANCES = {"tput": 0.30, "resume": 0.60, "open": 1.00, "build": 0.30, "packing": 0.02, "construct": 1.00,
              "mixing": 0.60,
              "integrity": 1.00}


def tolerance(name: str) -> float:
    return TOLERANCES.get(name.split()[0], 0.30)


def peer_ratios(data: dict[str, Any]) -> dict[str, float]:
    """impl / peer for resume at 90% (latency), warm open (latency) and throughput (tokens/s, 1 process)."""
    r = by_name(data)
    size = loadspec_info(data).get("size")
    out: dict[str, float] = {}
    impl_res = r.get("resume-impl-p90")
    for peer in ("hf-iterable", "hf-streaming", "hf-skip", "mosaicml", "litdata"):
        p = r.get(f"resume-{peer}-p90")
        v = _ratio(impl_res.median, p.median) if impl_res and p else None
        if v is not None:
            out[f"resume@90% latency impl/{peer}"] = v
    impl_open = r.get(f"open-impl-{size}")
    for peer in ("hf-load_from_disk", "hf-load_dataset", "mosaicml", "litdata"):
        p = r.get(f"open-{peer}-{size}")
        v = _ratio(impl_open.median, p.median) if impl_open and p else None
        if v is not None:
            out[f"warm open latency impl/{peer}"] = v
    impl_t = r.get("tput-impl-none-w0")
    for peer in ("hf-numpy-w0", "hf-arrow-w0", "mosaicml-w0", "litdata-w0"):
        p = r.get(f"tput-{peer}")
        v = _ratio(impl_t.tokens_per_s, p.tokens_per_s) if impl_t and p else None
        if v is not None:
            out[f"throughput tokens/s impl/{peer}"] = v
    return out


def targets(data: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """``(target, measured, note, met)`` for the issue's three targets (met None: not measurable in this run)."""
    r = by_name(data)
    size = loadspec_info(data).get("size")
    docs = {"S": 10_000, "M": 100_000, "L": 1_000_000}.get(size, 0)
    out = []
    p0, p90 = r.get("resume-impl-p00"), r.get("resume-impl-p90")
    if p0 and p90:
        v = p90.median / p0.median
        note = "" if docs >= 1_000_000 else f"(corpus {size}: {docs} documents; the target is for >= 1M: run L)"
        out.append(("resume p90 <= 1.5 x p0 (>= 1M documents)", (f"{v:.2f}x ({p0.median * 1e3:.1f} -> "
                    f"{p90.median * 1e3:.1f} ms)"), note, v <= TARGET_RESUME_FLAT if docs >= 1_000_000 else None))
    fresh = [r.get(f"resume-impl-fresh-{pos}") for pos in ("p00", "p50", "p90")]
    if all(fresh):
        worst = max(row.median for row in fresh if row)
        note = "TokenStore.open -> PackedDataset (plan cached) -> build_dataloader -> load_state_dict -> first batch"
        if docs < 1_000_000:
            note += f" (corpus {size}: {docs} documents; the target is for >= 1M: run L)"
        out.append(("resume, fresh loader -> first batch, <= 2 ms at every position (>= 1M documents)",
                    ", ".join(f"{row.extra.get('position', 0):.0%} {row.median * 1e3:.2f} ms" for row in fresh if row),
                    note, worst <= TARGET_RESUME_SECONDS if docs >= 1_000_000 else None))
    built = [row for row in r.values() if row.extra.get("kind") == "construct"]
    if built:
        worst = max(row.median for row in built)
        out.append(("PackedDataset construction <= 2 ms (plan cache warm)",
                    ", ".join(f"{row.extra['packing']}/{row.extra['shuffle']} {row.median * 1e3:.2f} ms" for row in built),
                    "PackedDataset(store, ...) + len on an opened store", worst <= TARGET_CONSTRUCT_SECONDS))
    pair = r.get("impl-first-vs-verified-none")
    if pair and "first_read_overhead" in pair.extra:
        v = float(pair.extra["first_read_overhead"])
        note = (f"512 packed batches on a store read for the first time ({pair.extra['first_ms']:.0f} ms) vs one "
                f"already verified ({pair.extra['verified_ms']:.0f} ms), alternating, file order")
        if size != "L":
            note += f" (corpus {size}: the target is for L)"
        out.append(("first-read block checks <= 5% of the packed iteration (L, file order)", f"{v:+.1%}", note,
                    v <= TARGET_FIRST_READ_CHECKS if size == "L" else None))
    opens = {row.extra.get("size"): row.median for row in r.values()
             if row.name.startswith("open-impl-") and row.extra.get("loader") == "impl"}
    if opens:
        shown = ", ".join(f"{s} {opens[s] * 1e3:.2f} ms" for s in ("S", "M", "L") if s in opens)
        big = max(opens, key=lambda s: "SML".index(s))
        v = opens[big] / opens["S"] if "S" in opens else None
        out.append(("warm TokenStore.open independent of token count", shown,
                    f"{big}/S = {v:.2f}x" if v else "", (v <= 2.0) if v is not None and big != "S" else None))
    out += mix_targets(r)
    for shuffle in ("none", "global"):
        raw, impl = r.get(f"tput-raw-{shuffle}-w0"), r.get(f"tput-impl-{shuffle}-w0")
        floor = r.get(f"tput-floor-{shuffle}-w0")
        if raw and impl and raw.tokens_per_s and impl.tokens_per_s:
            v = impl.tokens_per_s / raw.tokens_per_s
            note = f"concat, {shuffle} shuffle, batch 8"
            if floor and floor.tokens_per_s:
                note += (f"; the output's floor (four int64 fields written, nothing computed) is "
                         f"{floor.tokens_per_s / raw.tokens_per_s:.0%} of raw, impl "
                         f"{impl.tokens_per_s / floor.tokens_per_s:.1%} of the floor")
            out.append((f"single-process packed throughput >= 50% of raw mmap gather ({shuffle})",
                        f"{v:.1%} ({impl.tokens_per_s / 1e6:.1f} M vs {raw.tokens_per_s / 1e6:.0f} M tokens/s)",
                        note, v >= TARGET_TPUT_FRACTION))
    return out


def mix_targets(r: dict[str, Row]) -> list[tuple[str, str, str, bool | None]]:
    """Issue 10's targets: mixture throughput within 10 % of one dataset, resume flat in position, plan build shown."""
    out: list[tuple[str, str, str, bool | None]] = []
    tput = mixing_rows(r, "mixing-throughput")
    single = tput.get(1)
    mixed = {k: row for k, row in sorted(tput.items()) if k > 1 and row.tokens_per_s}
    if single is not None and single.tokens_per_s and mixed:
        shares = {k: row.tokens_per_s / single.tokens_per_s for k, row in mixed.items()}
        out.append(("mixture throughput >= 90% of one PackedDataset (same tokens, batch 8, no workers)",
                    ", ".join(f"{k} sources {v:.0%} ({mixed[k].tokens_per_s / 1e6:.1f} M tok/s)"
                              for k, v in shares.items()) + f"; single {single.tokens_per_s / 1e6:.1f} M tok/s",
                    "sources: contiguous splits of the store, weights 1..K, all_exhausted",
                    min(shares.values()) >= TARGET_MIX_TPUT_FRACTION))
    res = mixing_resume(r)
    for k in sorted({k for k, _ in res}):
        rows_k = sorted((pos, row) for (kk, pos), row in res.items() if kk == k)
        if len(rows_k) < 2:
            continue
        spread = max(row.median for _, row in rows_k) / min(row.median for _, row in rows_k)
        out.append((f"mixture resume flat in position ({k} sources): slowest <= 1.5 x fastest",
                    ", ".join(f"{pos:.0%} {row.median * 1e3:.2f} ms" for pos, row in rows_k),
                    "open -> datasets -> mixture -> loader -> load_state_dict -> first batch, all timed; sources in the "
                    "resumed batch: " + ", ".join(
                        f"{pos:.0%} {row.extra.get('sources_in_batch', '?')}" for pos, row in rows_k),
                    spread <= TARGET_RESUME_FLAT))
    plans = mixing_rows(r, "mixing-plan")
    if plans:
        out.append(("mixture plan build (one epoch, measured; no target)",
                    ", ".join(f"{k} sources {row.median * 1e3:.1f} ms ({row.extra.get('samples')} samples)"
                              for k, row in sorted(plans.items())), "MixedDataset.plan(0), sources' sizes known", None))
    return out
