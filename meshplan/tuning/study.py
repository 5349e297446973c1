"""`meshplan tune --model M --gpus N`: measure candidate plans with an Optuna study kept in SQLite.

The cost model ranks plans; `tune` checks the ranking by running them. The planner's top plans are
enqueued first (so the study starts from the model's best guesses), then Optuna's sampler explores
the plan space. Every trial runs `meshplan run` in its own process group with a timeout; a plan that
is invalid, fails, runs out of memory or times out is recorded with its reason and never stops the
study. The study lives in the storage (default sqlite:///tune.db): rerunning the same command
continues it, complete trials are not rerun, and a trial left RUNNING by a killed `tune` is failed
by Optuna's heartbeat check and retried once.

Fixed, not searched (each would multiply the trials for little on CPU): compile off (a CPU compile
takes minutes), float8 off, async TP off, the TorchTitan selective-AC op policy, even stage splits
(except for the planner's enqueued plans, which run exactly as planned).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplan.errors import InputError
from meshplan.fields import AUTO
from meshplan.planner.space import divisors
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import AC_MODES, PP_SCHEDULES, SINGLE_STAGE_SCHEDULES, V_SHAPED_SCHEDULES, Plan, plan_from_dict
from meshplan.specs.registry import resolve_model
from meshplan.yamlio import atomic_write_yaml, load_yaml_file

MAX_VIRTUAL = 4
HEARTBEAT_S = 30  # a RUNNING trial whose process died is failed (and retried) after GRACE_S without a beat
GRACE_S = 90


@dataclass
class TuneConfig:
    model: str
    gpus: int
    cluster: str
    seq_len: int
    global_batch: int
    dtype: str
    trials: int
    steps: int
    storage: str
    study: str
    out: Path
    runs_dir: Path
    timeout_s: float
    top: int


# -- the space -----------------------------------------------------------------------------------


def factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0 for rest in factorisations(n // d, parts - 1)]


def mesh_key(r: int, s: int, c: int, t: int, p: int) -> str:
    return f"r{r}-s{s}-c{c}-t{t}-p{p}"


def parse_mesh(key: str) -> tuple[int, int, int, int, int]:
    r, s, c, t, p = (int(x[1:]) for x in key.split("-"))
    return r, s, c, t, p


def mesh_choices(cfg: TuneConfig) -> list[str]:
    """Degrees gpus = dp_replicate * dp_shard * cp * tp * pp the model can take at all (tp divides the
    heads and FFN, pp <= layers, 2*cp divides the sequence); finer rules are checked per trial."""
    spec = resolve_model(cfg.model)
    out = []
    for r, s, c, t, p in factorisations(cfg.gpus, 5):
        if spec.n_heads % t or spec.n_kv_heads % t or spec.ffn_dim % t or p > spec.n_layers:
            continue
        if c > 1 and cfg.seq_len % (2 * c):
            continue
        out.append(mesh_key(r, s, c, t, p))
    if not out:
        raise InputError("--gpus", f"no data/tensor/pipeline/context split of {cfg.gpus} suits {spec.name}")
    return out


def pipeline_choices() -> list[str]:
    """(schedule, virtual stages) pairs the runtime accepts: 1 for GPipe / 1F1B, 2 for V-shaped."""
    out = []
    for sched in PP_SCHEDULES:
        vs = [1] if sched in SINGLE_STAGE_SCHEDULES else [2] if sched in V_SHAPED_SCHEDULES else range(1, MAX_VIRTUAL + 1)
        out += [f"{sched}:{v}" for v in vs]
    return out


def suggest(trial, cfg: TuneConfig, meshes: list[str]) -> dict[str, Any]:
    """The trial's plan fields; knobs that only exist for some meshes are suggested only there."""
    params: dict[str, Any] = {"mesh": trial.suggest_categorical("mesh", meshes),
                              "micro_batch": trial.suggest_categorical("micro_batch", divisors(cfg.global_batch)),
                              "ac": trial.suggest_categorical("ac", list(AC_MODES))}
    r, s, c, t, p = parse_mesh(params["mesh"])
    if t > 1:
        params["sequence_parallel"] = trial.suggest_categorical("sequence_parallel", [True, False])
    if p > 1:
        params["pipeline"] = trial.suggest_categorical("pipeline", pipeline_choices())
    if s > 1 and p == 1:
        params["reshard_after_forward"] = trial.suggest_categorical("reshard_after_forward", [True, False])
    return params


def plan_mapping(cfg: TuneConfig, params: dict[str, Any]) -> dict[str, Any]:
    r, s, c, t, p = parse_mesh(params["mesh"])
    sched, v = params.get("pipeline", "1F1B:1").split(":")
    return {"version": 1, "model": cfg.model, "cluster": cfg.cluster, "gpus": cfg.gpus,
            "training": {"seq_len": cfg.seq_len, "global_batch": cfg.global_batch,
                         "micro_batch": params["micro_batch"], "dtype": cfg.dtype},
            "parallel": {"dp_replicate": r, "dp_shard": s, "cp": c, "tp": t, "pp": p,
                         "sequence_parallel": params.get("sequence_parallel", False), "async_tp": False,
                         "pp_schedule": sched, "pp_virtual_stages": int(v), "pp_layers": None},
            "memory": {"activation_checkpointing": params["ac"], "sac_ops": None, "float8": False,
                       "reshard_after_forward": params.get("reshard_after_forward", True)},
            "compile": False}


def plan_params(plan: Plan) -> dict[str, Any]:
    """The inverse of plan_mapping, for enqueuing the planner's plans."""
    par, mem = plan.parallel, plan.memory
    params: dict[str, Any] = {"mesh": mesh_key(par.dp_replicate, par.dp_shard, par.cp, par.tp, par.pp),
                              "micro_batch": plan.training.micro_batch, "ac": mem.activation_checkpointing}
    if par.tp > 1:
        params["sequence_parallel"] = bool(par.sequence_parallel)
    if par.pp > 1:
        params["pipeline"] = f"{par.pp_schedule}:{par.pp_virtual_stages}"
    if par.dp_shard > 1 and par.pp == 1:
        params["reshard_after_forward"] = bool(mem.reshard_after_forward)
    return params


# -- the planner's plans -------------------------------------------------------------------------


def planner_plans(cfg: TuneConfig, profile: ClusterProfile) -> list[Plan]:
    """The cost model's top plans over the same fixed knobs the study uses."""
    from meshplan.planner.search import search

    base = plan_from_dict({
        "version": 1, "model": cfg.model, "cluster": cfg.cluster, "gpus": cfg.gpus,
        "training": {"seq_len": cfg.seq_len, "global_batch": cfg.global_batch, "micro_batch": AUTO, "dtype": cfg.dtype},
        "parallel": {"async_tp": False}, "memory": {"float8": False, "sac_ops": None}, "compile": False})
    result = search(base, profile, top_k=cfg.top)
    return [c.to_plan(result.base_plan) for c in result.ranked]


def enqueue_planner_plans(study, cfg: TuneConfig, profile: ClusterProfile, meshes: list[str]) -> int:
    """Only into a new study: on resume they are already in the storage (run or waiting)."""
    if study.trials:
        return 0
    n, seen = 0, []
    pipelines = pipeline_choices()
    for rank, plan in enumerate(planner_plans(cfg, profile), 1):
        params = plan_params(plan)
        if params["mesh"] not in meshes or params.get("pipeline", pipelines[0]) not in pipelines or params in seen:
            continue
        seen.append(params)
        # The full plan rides along: the planner's stage split and mesh order run exactly as planned.
        study.enqueue_trial(params, user_attrs={"planner_rank": rank, "planner_plan": plan.to_dict()})
        n += 1
    return n


# -- running one plan ----------------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # ok | failed | oom | timeout
    reason: str = ""
    measured: dict[str, Any] | None = None


def run_plan(plan_path: Path, run_dir: Path, steps: int, timeout_s: float) -> Outcome:
    """`meshplan run` in its own process group; on timeout the whole group (torchrun and its workers) is killed."""
    log_path = run_dir / "run.log"
    cmd = [sys.executable, "-m", "meshplan", "run", "--plan", str(plan_path), "--steps", str(steps),
           "--out", str(run_dir), "--quiet"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return Outcome("timeout", f"no result within {timeout_s:g} s (process group killed)")
    if code != 0:
        return classify_failure(code, log_path)
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return Outcome("failed", "exit 0 but no summary.json")
    return Outcome("ok", measured=load_yaml_file(summary, "summary.json")["measured"])


def kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def classify_failure(code: int, log_path: Path) -> Outcome:
    text = log_path.read_text(errors="replace")
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("*")]
    last = next((l for l in reversed(lines) if "error" in l.lower()), lines[-1] if lines else "")
    if re.search(r"out of memory|MemoryError|OutOfMemory", text) or code in (-9, 137):
        return Outcome("oom", f"exit {code}: {last.strip()[:200]}")
    return Outcome("failed", f"exit {code}: {last.strip()[:200]}")


# -- the objective -------------------------------------------------------------------------------


class RunFailed(Exception):
    """A trial whose run failed: Optuna records it as FAIL (caught by study.optimize), the study goes on."""


def predicted(plan: Plan, profile: ClusterProfile) -> dict[str, Any]:
    from meshplan.cost_models.estimate import estimate_plan

    est = estimate_plan(plan, profile)
    return {"step_time_s": est.step_time_s, "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
            "peak_memory_gib": est.peak_memory_gib, "fits": est.fits}


def duplicate_of(trial, params: dict[str, Any]):
    """A complete trial with the same plan fields (the sampler may propose a measured plan again)."""
    import optuna

    for other in trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if other.params == params and other.number != trial.number:
            return other
    return None


def trial_plan(trial, cfg: TuneConfig, params: dict[str, Any]) -> Plan:
    """The enqueued planner plan when this trial is one, else the plan the suggested fields describe."""
    given = trial.user_attrs.get("planner_plan")
    data = given if given and plan_params(plan_from_dict(given)) == params else plan_mapping(cfg, params)
    plan = plan_from_dict(data)
    from meshplan.runtime.options import check_runnable

    check_runnable(plan)
    return plan


def objective(trial, cfg: TuneConfig, profile: ClusterProfile, meshes: list[str]) -> float:
    import optuna

    params = suggest(trial, cfg, meshes)
    try:
        plan = trial_plan(trial, cfg, params)
    except InputError as exc:
        trial.set_user_attr("status", "invalid")
        trial.set_user_attr("reason", str(exc))
        raise optuna.TrialPruned(str(exc))
    pred = predicted(plan, profile)
    trial.set_user_attr("plan", plan.to_dict())
    trial.set_user_attr("predicted", pred)
    if not pred["fits"]:
        trial.set_user_attr("status", "invalid")
        trial.set_user_attr("reason", f"predicted peak {pred['peak_memory_gib']:.3g} GiB > usable memory (not run)")
        raise optuna.TrialPruned("predicted not to fit")
    dup = duplicate_of(trial, params)
    if dup is not None:
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("duplicate_of", dup.number)
        trial.set_user_attr("measured", dup.user_attrs.get("measured"))
        return float(dup.value)
    return measure(trial, cfg, plan)


def measure(trial, cfg: TuneConfig, plan: Plan) -> float:
    run_dir = cfg.runs_dir / f"trial-{trial.number:04d}"
    if run_dir.exists():  # left by an attempt killed earlier: its files must not pass for this run's
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    plan_path = run_dir / "plan.yaml"
    atomic_write_yaml(plan_path, plan.to_dict())
    trial.set_user_attr("run_dir", str(run_dir))
    out = run_plan(plan_path, run_dir, cfg.steps, cfg.timeout_s)
    trial.set_user_attr("status", out.status)
    if out.status != "ok":
        trial.set_user_attr("reason", out.reason)
        raise RunFailed(out.reason)
    m = out.measured
    trial.set_user_attr("measured", {k: m.get(k) for k in ("step_time_s", "tokens_per_s_per_gpu", "peak_memory_gib")})
    return float(m["tokens_per_s_per_gpu"])


# -- report --------------------------------------------------------------------------------------


def ranks(values: dict[int, float]) -> dict[int, int]:
    """1 = highest throughput; equal values share the best rank of their group."""
    from scipy.stats import rankdata

    keys = list(values)
    r = rankdata([-values[k] for k in keys], method="min") if keys else []
    return {k: int(x) for k, x in zip(keys, r)}


def describe(params: dict[str, Any]) -> str:
    bits = [params.get("mesh", "?"), f"mb{params.get('micro_batch', '?')}", f"ac={params.get('ac', '?')}"]
    if "sequence_parallel" in params:
        bits.append("sp" if params["sequence_parallel"] else "no-sp")
    if "pipeline" in params:
        bits.append(params["pipeline"])
    if params.get("reshard_after_forward") is False:
        bits.append("no-reshard")
    return " ".join(bits)


def trial_table(study) -> tuple[str, float | None]:
    """Every trial: predicted vs measured throughput and rank; and their Spearman correlation."""
    trials = study.get_trials(deepcopy=False)
    measured = {t.number: t.value for t in trials if t.value is not None}
    pred = {t.number: t.user_attrs["predicted"]["tokens_per_s_per_gpu"] for t in trials
            if t.number in measured and "predicted" in t.user_attrs}
    mr, pr = ranks(measured), ranks(pred)
    lines = [f"{'#':>4} {'state':<8} {'plan':<44} {'pred tok/s':>10} {'rank':>4} {'meas tok/s':>10} {'rank':>4}  note"]
    for t in trials:
        p = t.user_attrs.get("predicted", {}).get("tokens_per_s_per_gpu")
        note = t.user_attrs.get("reason", "")
        if "planner_rank" in t.user_attrs:
            note = f"planner #{t.user_attrs['planner_rank']} " + note
        if "duplicate_of" in t.user_attrs:
            note += f"same plan as #{t.user_attrs['duplicate_of']}"
        lines.append(f"{t.number:>4} {t.state.name:<8} {describe(t.params)[:44]:<44} "
                     f"{'' if p is None else f'{p:,.0f}':>10} {pr.get(t.number, ''):>4} "
                     f"{'' if t.value is None else f'{t.value:,.0f}':>10} {mr.get(t.number, ''):>4}  {note[:90]}")
    rho = None
    keys = sorted(pred)
    if len(keys) >= 3 and len({pred[k] for k in keys}) > 1 and len({measured[k] for k in keys}) > 1:
        from scipy.stats import spearmanr

        rho = float(spearmanr([pred[k] for k in keys], [measured[k] for k in keys]).statistic)
    return "\n".join(lines), rho


def write_best(study, out: Path) -> dict[str, Any] | None:
    import optuna

    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if "plan" in t.user_attrs]
    if not done:
        return None
    best = max(done, key=lambda t: t.value)
    pred = best.user_attrs.get("predicted", {})
    estimate = {k: round(v, 6) if isinstance(v, float) else v for k, v in pred.items()}
    atomic_write_yaml(out, {**best.user_attrs["plan"], "estimate": estimate})
    return {"trial": best.number, "tokens_per_s_per_gpu": best.value, **(best.user_attrs.get("measured") or {})}


def open_study(cfg: TuneConfig):
    import warnings

    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    with warnings.catch_warnings():  # heartbeats are marked experimental; the behaviour is what we need
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = RDBStorage(cfg.storage, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                             heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))
    return optuna.create_study(storage=storage, study_name=cfg.study, load_if_exists=True, direction="maximize",
                               sampler=optuna.samplers.TPESampler(seed=0))


def _progress(study, trial) -> None:
    status = trial.user_attrs.get("status", trial.state.name.lower())
    value = "" if trial.value is None else f" {trial.value:,.1f} tok/s/gpu"
    reason = trial.user_attrs.get("reason", "")
    print(f"trial {trial.number}: {describe(trial.params)}: {status}{value} {reason}".rstrip(), flush=True)
