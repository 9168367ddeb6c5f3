"""``python -m benchmarks.report RESULTS.json`` (``make bench-report``): REPORT.md and plots.

Writes ``benchmarks/report/REPORT.md`` (machine, versions, the issue's
targets, impl/peer ratios, one table per figure family) and
``benchmarks/report/resume.png`` (resume latency vs position per loader),
``benchmarks/report/throughput.png`` (tokens/s per loader against the raw
gather limit). matplotlib lives in the bench venv only; without it the
markdown is still written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import figures

OUT = Path(__file__).resolve().parent / "report"


def _ms(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _rate(v: float | None, unit: str = "") -> str:
    if v is None:
        return "–"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:.2f} {suffix}{unit}"
    return f"{v:.1f} {unit}"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *["| " + " | ".join(row) + " |" for row in body], ""]


def markdown(data: dict, rss: list[dict] | None, plots: list[str], skipped: list[str]) -> str:
    info = figures.loadspec_info(data)
    m = info.get("machine", {})
    rows = figures.rows(data)
    by = {r.name: r for r in rows}
    size = info.get("size", "?")
    lines = [f"# loadspec benchmarks — corpus {size}", ""]
    lines += [(f"Machine `{info.get('machine_name')}`: {m.get('cpu')}, nproc {m.get('nproc')}, RAM {m.get('ram_gib')} "
              f"GiB (page cache at start {m.get('page_cache_gib')} GiB), {m.get('platform')}; Python {info.get('python')}; "
              f"run {data.get('datetime', '?')}."), ""]
    versions = info.get("versions") or {}
    lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + ".", ""]
    resident = (info.get("page_cache_resident") or {}).get("store_at_start")
    lines += [f"Page cache: {resident:.0%} of the {size} token store was resident when the run started (fincore); "
              "every timed benchmark but the cold build runs after a warmup round, so its figures are page-cache "
              "warm." if resident is not None else "Page cache: store residency unknown (fincore missing or the "
              "corpus was generated during the run); timed benchmarks run after a warmup round (warm).", ""]
    c = info.get("corpus") or {}
    lines += [(f"Corpus: log-normal document lengths (median {c.get('median_tokens')} tokens, sigma {c.get('sigma')}, "
              f"clipped to {c.get('clip')}), KJV token ids, EOS-terminated; seed {c.get('seed')}. Times are medians "
              "of the rounds."), ""]

    lines += ["## Targets", ""]
    lines += _table(["target", "measured", "note", "met"],
                    [[t, v, n, {True: "yes", False: "**no**", None: "n/a in this run"}[ok]]
                     for t, v, n, ok in figures.targets(data)])
    pr = figures.peer_ratios(data)
    if pr:
        lines += ["## impl / peer", "", "Latency ratios < 1 and throughput ratios > 1 favour impl.", ""]
        lines += _table(["figure", "impl / peer"], [[k, f"{v:.3g}"] for k, v in pr.items()])

    def section(title: str, kind: str, header: list[str], fmt, note: str = "") -> None:
        sel = [r for r in rows if r.extra.get("kind") == kind]
        if not sel:
            return
        nonlocal lines
        lines += [f"## {title}", ""] + ([note, ""] if note else [])
        lines += _table(header, [fmt(r) for r in sel])

    section("Warm open", "open", ["loader", "size", "documents", "tokens", "median", "min"],
            lambda r: [r.extra["loader"], r.extra["size"], str(r.extra.get("documents")), str(r.extra.get("tokens")),
                       _ms(r.median), _ms(r.min)])
    section("Dataset construction (plan cache warm)", "construct", ["packing", "shuffle", "documents", "samples",
                                                                     "median", "min"],
            lambda r: [r.extra["packing"], r.extra["shuffle"], str(r.extra.get("documents")),
                       str(r.extra.get("samples")), _ms(r.median), _ms(r.min)],
            note="PackedDataset(store, ...) + len on a freshly opened store: what a restarted process pays before "
                 "its first batch (no token file is read).")
    def integrity_cells(r: figures.Row) -> list[str]:
        if "first_read_overhead" in r.extra:
            own = f" (checks {r.extra['check_overhead']:+.1%})" if "check_overhead" in r.extra else ""
            return [r.extra["mode"], r.extra.get("shuffle", ""), f"{r.extra['first_ms']:.0f} ms first read",
                    f"{r.extra['verified_ms']:.0f} ms verified", f"{r.extra['first_read_overhead']:+.1%}{own}"]
        return [r.extra["mode"], r.extra.get("shuffle", ""), _ms(r.median), _ms(r.min),
                f"{r.extra['check_fraction']:.1%}" if "check_fraction" in r.extra else "–"]

    section("Block checks (integrity)", "integrity", ["mode", "shuffle", "median", "min", "overhead"],
            integrity_cells,
            note="benchmarks/test_integrity.py: impl-first-vs-verified = 512 packed batches on a store read for "
                 "the first time against one already verified, alternating (issue 8's figure: first / verified - "
                 "1; in brackets the checks' own share, first / a fresh store without block checks - 1); impl = "
                 "the packed iteration; +check-first / +check-verified add a second check_blocks of "
                 "each batch's token runs on a fresh / a verified store (overhead: those calls' time over the "
                 "rest of the same round, an upper bound).")
    section("Cold build (tokenize + index, 2 processes)", "build", ["loader", "documents", "tokens", "time", "tokens/s"],
            lambda r: [r.extra["loader"], str(r.extra.get("documents")), str(r.extra.get("tokens")), _ms(r.median),
                       _rate(r.tokens_per_s)])
    section("Build against the raw tokenizer (same texts, same cores, one run)", "build-vs-raw",
            ["processes", "documents", "build tokens/s", "raw encode tokens/s", "build / raw"],
            lambda r: [str(r.extra["num_proc"]), str(r.extra.get("documents")),
                       _rate(r.extra.get("build_tokens_per_s")), _rate(r.extra.get("raw_tokens_per_s")),
                       f"{r.extra['ratio']:.3f}"],
            note="benchmarks/test_build.py::test_build_vs_raw_encode: TokenStore.build(texts, num_proc) against "
                 "Tokenizer.encode_batch_fast over the same texts in batches of 1000 on all cores (issue 20's "
                 "target: >= 0.9).")
    section("A multi-task build against the raw tokenizer (same texts, same cores, one run)", "build-tasks-vs-raw",
            ["tasks", "documents", "build tokens/s", "raw encode tokens/s", "build / raw", "CPU: raw / build"],
            lambda r: [str(r.extra["tasks"]), str(r.extra.get("documents")),
                       _rate(r.extra.get("build_tokens_per_s")), _rate(r.extra.get("raw_tokens_per_s")),
                       f"{r.extra['ratio']:.3f}", f"{r.extra['cpu_ratio']:.3f}"],
            note="benchmarks/test_build.py::test_build_tasks_vs_raw_encode: N concurrent processes, each "
                 "build_task(parquet, tok, out, task=i, tasks=N) (loadspec build --task i --tasks N), then "
                 "commit_build, from process start to the committed store, against Tokenizer.encode_batch_fast "
                 "over the same texts; CPU: raw encode's CPU seconds over the tasks' and the commit's.")
    res = [r for r in rows if r.extra.get("kind") == "resume"]
    if res:
        loaders = list(dict.fromkeys(r.extra["loader"] for r in res))
        positions = sorted({r.extra["position"] for r in res})
        body = []
        for ld in loaders:
            cells = [ld]
            for p in positions:
                hit = [r for r in res if r.extra["loader"] == ld and r.extra["position"] == p]
                cells.append(_ms(hit[0].median) if hit else "–")
            unit = next(r.extra.get("unit") for r in res if r.extra["loader"] == ld)
            cells.append(unit)
            body.append(cells)
        lines += ["## Resume: fresh loader, load_state_dict -> first batch", "",
                  ("impl: the loader is built untimed; impl-fresh: TokenStore.open -> PackedDataset -> "
                   "build_dataloader -> load_state_dict -> first batch, all timed (epoch plan cached on disk)."), ""]
        lines += _table(["loader", *[f"{round(p * 100)}%" for p in positions], "position counts"], body)
    tp = [r for r in rows if r.extra.get("kind") == "throughput"]
    if tp:
        raw = {s: by.get(f"tput-raw-{s}-w0") for s in ("none", "global")}
        body = []
        for r in tp:
            limit = raw.get(r.extra.get("shuffle") or "none")
            frac = (r.tokens_per_s / limit.tokens_per_s) if limit and limit.tokens_per_s and r.tokens_per_s else None
            shuffle = r.extra.get("shuffle") if r.extra["loader"] in ("impl", "raw", "floor") else ""
            body.append([r.extra["loader"], shuffle, str(r.extra["workers"]), r.extra.get("unit", ""),
                         _rate(r.items_per_s, "/s"), _rate(r.tokens_per_s, " tok/s"),
                         f"{frac:.1%}" if frac is not None else "–"])
        lines += ["## Iteration throughput", "",
                  ("impl: packed seq_len=2048 samples, batch 8; raw: the same token runs copied out of the mapped "
                  "files (the limit); floor: those copies into int64 plus one write of each of the other three "
                  "int64 fields, nothing computed (the output's memory traffic: no loader producing the four "
                  "int64 fields can beat it); peers: documents, batch 32 (they do not pack). Fraction = "
                  "tokens/s over raw (same shuffle)."), ""]
        lines += _table(["loader", "shuffle", "workers", "items", "items/s", "tokens/s", "of raw"], body)
    section("Packing modes", "packing", ["mode", "utilisation", "corpus tokens used", "samples/epoch", "samples/s",
                                         "tokens/s"],
            lambda r: [r.extra["mode"], f"{r.extra['utilisation']:.1%}", f"{r.extra['corpus_tokens_used']:.1%}",
                       str(r.extra["samples"] if isinstance(r.extra.get("samples"), int) else "?"),
                       _rate(r.extra.get("count", 0) / r.median if r.median else None, "/s"), _rate(r.tokens_per_s)],
            note="Utilisation: non-padding positions / (samples x seq_len), over the whole epoch plan.")
    section("Plan computation (one epoch, no cache)", "plan", ["mode", "documents", "samples", "time"],
            lambda r: [r.extra["mode"], str(r.extra.get("documents")), str(r.extra.get("samples")), _ms(r.median)])
    lines += _mixing_section(by)
    rss_rows = [r.extra for r in rows if r.extra.get("kind") == "rss" and "peak_rss_mb" in r.extra]
    rss_rows += [x for x in (rss or []) if "peak_rss_mb" in x and not any(
        y.get("loader") == x.get("loader") and y.get("workers") == x.get("workers") for y in rss_rows)]
    if rss_rows:
        lines += ["## Peak RSS across one epoch (fresh subprocess)", "",
                  "peak RSS counts touched memory-mapped pages; anon = memory the process allocated (sampled).", ""]
        lines += _table(["loader", "workers", "size", "items", "epoch", "baseline RSS", "peak RSS", "peak anon",
                         "largest worker"],
                        [[x["loader"], str(x["workers"]), str(x.get("size")), str(x.get("items")),
                          f"{x.get('epoch_seconds')} s", f"{x.get('baseline_rss_mb')} MB", f"{x['peak_rss_mb']} MB",
                          f"{x.get('peak_anon_mb')} MB", f"{x.get('children_peak_rss_mb')} MB"] for x in rss_rows])
    ratios = figures.ratios(data)
    if ratios:
        lines += ["## Gate ratios (make bench-compare)", ""]
        lines += _table(["ratio", "value", "better"], [[k, f"{v:.4g}", b] for k, (v, b) in ratios.items()])
    if skipped:
        lines += ["## Skipped", "", *[f"- {s}" for s in skipped], ""]
    if plots:
        lines += ["## Plots", "", *[f"![{p}]({p})" for p in plots], ""]
    return "\n".join(lines)


def _mixing_section(by: dict[str, figures.Row]) -> list[str]:
    """Mixtures (``test_mixing.py``): throughput against one PackedDataset, resume by position, plan build."""
    tput = figures.mixing_rows(by, "mixing-throughput")
    res = figures.mixing_resume(by)
    plans = figures.mixing_rows(by, "mixing-plan")
    if not (tput or res or plans):
        return []
    lines = ["## Mixtures", "",
             ("K contiguous splits of the store, each its own PackedDataset (concat, seq_len 2048, global shuffle), "
              "mixed by MixedDataset with weights 1..K under all_exhausted; single: one PackedDataset over the whole "
              "store. Throughput: the same token budget, batch 8, no workers. Resume, all timed: TokenStore.open -> "
              "the K split datasets (plans cached on disk) -> MixedDataset -> build_dataloader (the mixture's "
              "plan) -> load_state_dict -> first batch of 8."), ""]
    single = tput.get(1)
    if tput:
        lines += _table(["sources", "tokens/s", "of single"],
                        [["single" if k == 1 else str(k), _rate(row.tokens_per_s, " tok/s"),
                          f"{row.tokens_per_s / single.tokens_per_s:.0%}"
                          if single and single.tokens_per_s and row.tokens_per_s else "–"]
                         for k, row in sorted(tput.items())])
    if res:
        positions = sorted({pos for _, pos in res})
        lines += _table(["sources", *[f"{round(p * 100)}%" for p in positions], "sources in the batch"],
                        [[str(k), *[_ms(res[(k, p)].median) if (k, p) in res else "–" for p in positions],
                          ", ".join(str(res[(k, p)].extra.get("sources_in_batch", "?")) for p in positions
                                    if (k, p) in res)]
                         for k in sorted({k for k, _ in res})])
    if plans:
        lines += _table(["sources", "samples", "plan build"],
                        [[str(k), str(row.extra.get("samples")), _ms(row.median)] for k, row in sorted(plans.items())])
    return lines


def plot(data: dict, out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (it lives in .venv-bench): no plots", file=sys.stderr)
        return []
    rows = figures.rows(data)
    made = []
    res = [r for r in rows if r.extra.get("kind") == "resume"]
    if res:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for ld in dict.fromkeys(r.extra["loader"] for r in res):
            pts = sorted((r.extra["position"], r.median) for r in res if r.extra["loader"] == ld)
            ax.plot([p * 100 for p, _ in pts], [t * 1e3 for _, t in pts], marker="o", label=ld)
        ax.set_yscale("log")
        ax.set_xlabel("resume position (% of epoch)")
        ax.set_ylabel("load_state_dict -> first batch (ms, log)")
        ax.set_title(f"Resume latency, corpus {figures.loadspec_info(data).get('size')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "resume.png", dpi=110)
        plt.close(fig)
        made.append("resume.png")
    tp = [r for r in rows if r.extra.get("kind") == "throughput" and r.tokens_per_s]
    if tp:
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(tp) + 1.5))
        labels = [r.name.replace("tput-", "") for r in tp]
        vals = [r.tokens_per_s / 1e6 for r in tp]
        palette = {"raw": "tab:gray", "floor": "tab:olive", "impl": "tab:blue"}
        colors = [palette.get(r.extra["loader"], "tab:orange") for r in tp]
        ax.barh(labels, vals, color=colors)
        for s, style in (("none", "--"), ("global", ":")):
            raw = next((r for r in tp if r.name == f"tput-raw-{s}-w0"), None)
            if raw:
                ax.axvline(raw.tokens_per_s / 1e6, color="k", linestyle=style, label=f"raw gather limit ({s})")
        ax.set_xscale("log")
        ax.set_xlabel("M tokens/s (log)")
        ax.set_title("Throughput vs the raw mmap gather (gray: limit, olive: output floor, blue: impl, orange: peers)")
        ax.invert_yaxis()
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
        made.append("throughput.png")
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default="benchmarks/results/bench-M.json")
    ap.add_argument("--rss", default=None, help="JSON from `python -m benchmarks.rss --all --out ...`")
    ap.add_argument("--skipped", default=None, help="skipped benchmarks and reasons (default: RESULTS.skipped.txt)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    if not Path(args.results).exists():
        print(f"no results at {args.results}: run `make bench` first", file=sys.stderr)
        return 2
    data = figures.load(args.results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rss = None
    rss_path = Path(args.rss) if args.rss else None
    if rss_path is None:
        size = figures.loadspec_info(data).get("size")
        guess = Path(args.results).parent / f"rss-{'S' if size == 'S' else 'M'}.json"
        rss_path = guess if guess.exists() else None
    if rss_path and rss_path.exists():
        rss = json.loads(rss_path.read_text())
    skipped = []
    skipped_path = Path(args.skipped) if args.skipped else Path(args.results).with_suffix(".skipped.txt")
    if skipped_path.exists():
        skipped = [ln.strip() for ln in skipped_path.read_text().splitlines() if ln.strip()]
    plots = plot(data, out)
    (out / "REPORT.md").write_text(markdown(data, rss, plots, skipped))
    print(f"wrote {out / 'REPORT.md'}" + (f" and {', '.join(plots)}" if plots else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
