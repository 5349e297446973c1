"""`meshplan calibrate RUN_DIR...`: fit a cluster profile's efficiency terms to measured runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from meshplan.commands.argparsing import ArgumentParser
from meshplan.cost_models.calibrate import (Run, calibrate, error_table, errors, load_run, predict,
                                           profile_document, provenance)
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.yamlio import atomic_write_yaml


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan calibrate", description="Fit a cluster profile's efficiency terms to "
                        "measured runs (meshplan run --out DIR) by least squares.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories holding summary.json")
    ap.add_argument("--profile", default=None, help="profile name or path to start from (default: the runs' cluster)")
    ap.add_argument("--out", default=None, help="where to write the calibrated profile (default <name>-calibrated.yaml)")
    return ap


def base_profile_name(runs: list[Run], given: str | None) -> str:
    if given:
        return given
    clusters = sorted({r.plan.cluster for r in runs})
    if len(clusters) > 1:
        raise InputError("--profile", f"runs used different clusters ({', '.join(clusters)}); name one with --profile")
    return clusters[0]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if len(set(args.runs)) != len(args.runs):
        raise InputError("RUN_DIR", "the same run directory is given twice")
    runs = [load_run(d) for d in args.runs]
    name = base_profile_name(runs, args.profile)
    base = load_profile(name)
    out = Path(args.out or f"{base.name}-calibrated.yaml")
    if out.suffix not in (".yaml", ".yml"):
        raise InputError("--out", f"must name a .yaml file, got {str(out)!r}")
    fit = calibrate(runs, base)
    fitted = replace(fit.profile, name=f"{base.name}-calibrated")
    ests_b, ests_a = predict(runs, base), predict(runs, fitted)
    before, after = errors(runs, ests_b), errors(runs, ests_a)
    atomic_write_yaml(out, profile_document(fitted, provenance(fit, runs, before, after, name)))
    print(f"calibrated {name} on {len(runs)} run(s) -> {out}")
    for k in fit.before:
        flag = "  (not seen by these runs: kept)" if k in fit.unconstrained else ""
        print(f"  {k:<45} {fit.before[k]:>12.6g} -> {fit.after[k]:<12.6g}{flag}")
    print(error_table(runs, before, after, ests_b, ests_a))
    print("(errors after calibration are in-sample: the same runs were used for the fit)")
    return 0
