"""The regression gate: ``python -m benchmarks.compare RESULTS.json`` (``make bench-compare``).

Compares the run's ratios (``benchmarks.figures.ratios``: impl against the
raw-gather limit, against itself at p0 / size S, against HF on the same
corpus, packing utilisation) with the committed baseline
``benchmarks/baselines/<machine>.json`` (section = corpus size). Absolute
seconds are never gated: machines are noisy, ratios measured in one run are
not. Exits 1 when a ratio regresses beyond its tolerance, 2 when there is no
baseline for this machine and size (write one with ``--update``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from benchmarks import figures, machine

BASELINES = Path(__file__).resolve().parent / "baselines"


def baseline_path(name: str | None = None) -> Path:
    return BASELINES / f"{name or machine.name()}.json"


def compare(current: dict[str, tuple[float, str]], base: dict[str, dict]) -> tuple[list[str], list[str]]:
    """``(failures, lines)``: one line per ratio, a failure per regression beyond tolerance."""
    failures, lines = [], []
    for name in sorted(set(base) | set(current)):
        if name not in current:
            lines.append(f"  ?    {name}: in the baseline, not measured in this run")
            continue
        value, better = current[name]
        if name not in base:
            lines.append(f"  new  {name}: {value:.4g} (no baseline)")
            continue
        ref, tol = float(base[name]["value"]), float(base[name].get("tolerance", figures.tolerance(name)))
        if better == "higher":
            bad = value < ref * (1 - tol)
        else:
            bad = value > ref * (1 + tol)
        change = (value / ref - 1) if ref else float("inf")
        tag = "FAIL" if bad else "ok  "
        lines.append(f"  {tag} {name}: {value:.4g} vs baseline {ref:.4g} ({change:+.0%}, {better} is better, "
                     f"tolerance {tol:.0%})")
        if bad:
            failures.append(name)
    return failures, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default="benchmarks/results/bench-M.json")
    ap.add_argument("--baseline", default=None, help="baseline file (default: baselines/<machine>.json)")
    ap.add_argument("--update", action="store_true", help="write this run's ratios as the baseline for its size")
    ap.add_argument("--merge", action="store_true",
                    help="with --update: replace only the ratios this run measured, keep the section's others "
                         "(for a run of a few benchmarks, e.g. -k 'resume-impl or construct or open-impl')")
    args = ap.parse_args(argv)
    if not Path(args.results).exists():
        print(f"no results at {args.results}: run `make bench` first", file=sys.stderr)
        return 2
    data = figures.load(args.results)
    info = figures.loadspec_info(data)
    size = info.get("size", "?")
    name = info.get("machine_name") or machine.name()
    path = Path(args.baseline) if args.baseline else baseline_path(name)
    current = figures.ratios(data)
    if args.update:
        doc = json.loads(path.read_text()) if path.exists() else {"machine": name, "sizes": {}}
        doc["machine_facts"] = info.get("machine")
        measured = {k: {"value": round(v, 6), "better": b, "tolerance": figures.tolerance(k)}
                    for k, (v, b) in sorted(current.items())}
        kept = doc["sizes"].get(size, {}).get("ratios", {}) if args.merge else {}
        doc["sizes"][size] = {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": info.get("versions"),
            "ratios": dict(sorted({**kept, **measured}.items())),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(current)} ratios for size {size} to {path}")
        return 0
    if not path.exists():
        print(f"no baseline {path} for this machine ({name}); create it with "
              f"`python -m benchmarks.compare {args.results} --update` and commit it", file=sys.stderr)
        return 2
    doc = json.loads(path.read_text())
    section = doc.get("sizes", {}).get(size)
    if section is None:
        print(f"{path} has no section for corpus size {size} (has {sorted(doc.get('sizes', {}))}); "
              f"run with that LOADSPEC_BENCH_SIZE or add one with --update", file=sys.stderr)
        return 2
    failures, lines = compare(current, section["ratios"])
    print(f"bench-compare: {args.results} (size {size}) vs {path}")
    print("\n".join(lines))
    if failures:
        print(f"REGRESSION: {len(failures)} ratio(s) beyond tolerance: {', '.join(failures)}", file=sys.stderr)
        return 1
    print("no regression beyond tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
