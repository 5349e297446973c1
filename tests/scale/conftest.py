"""The scale tests' runs: every `meshplan run` that does not depend on another starts at once when
the session first needs one (this 2-core machine spends most of a run importing torch and waiting
at rendezvous, so overlapping them saves minutes); each test then waits for the runs it checks,
under a hard time limit. Runs still going at the end of the session are killed."""

import shutil
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Lets tests import helpers.py next to them.
sys.path.insert(0, str(Path(__file__).parent))

from helpers import STEPS, Job, Run, free_port, metrics, plan, start_run, write_plan  # noqa: E402
from meshplan.runtime.checkpoint import latest  # noqa: E402

COMMON = ("--steps", str(STEPS), "--track-memory", "off", "--quiet")


@dataclass
class Jobs:
    root: Path
    plans: dict[str, Path]
    jobs: dict[str, Job] = field(default_factory=dict)
    crash_state: dict = field(default_factory=dict)

    def start(self, name: str, plan_name: str, *args: str, nodes: int = 1, env: dict | None = None,
              out: Path | None = None) -> Job:
        out = out or self.root / name
        extra: list[list[str]] = [[]]
        if nodes > 1:
            endpoint, rdzv_id = f"127.0.0.1:{free_port()}", f"t-{uuid.uuid4().hex[:8]}"
            extra = [["--nnodes", str(nodes), "--node-rank", str(r), "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
                     for r in range(nodes)]

        def start_all(attempt: str = "") -> list[Run]:
            return [start_run(self.root / f"{name}{attempt}.{i}.log", "--plan", str(self.plans[plan_name]), "--out",
                              str(out), *COMMON, *args, *e, env=env) for i, e in enumerate(extra)]

        self.jobs[name] = Job(start_all(), out, lambda: start_all(".again"))
        return self.jobs[name]

    def __getitem__(self, name: str) -> Job:
        return self.jobs[name]

    def kill_leftovers(self) -> None:
        for job in self.jobs.values():
            for r in job.runs:
                if r.proc.poll() is None:
                    r.kill()


@pytest.fixture(scope="session")
def plans(tmp_path_factory) -> dict[str, Path]:
    """The plans of the scale tests, all tiny-4l with seq 32 and global batch 8 (the same data)."""
    d = tmp_path_factory.mktemp("plans")
    return {
        "fsdp_tp": write_plan(d / "fsdp_tp.yaml", plan(dp_shard=2, tp=2, sequence_parallel=True)),  # 4 ranks
        "fsdp": write_plan(d / "fsdp.yaml", plan(dp_shard=2)),                                      # 2 ranks
        "pp": write_plan(d / "pp.yaml", plan(pp=2, pp_schedule="1F1B")),                            # 2 ranks
    }


@pytest.fixture(scope="session")
def jobs(tmp_path_factory, plans):
    """Start the independent runs together:
    ref_fsdp_tp  4 ranks FSDP x TP 2x2, one agent, checkpoints every 4 steps (also the re-plan source)
    two_nodes    the same plan on two agents of 2 workers meeting at a c10d rendezvous
    ref_fsdp     2 ranks FSDP, uninterrupted (reference of the recovery runs)
    killed       2 ranks FSDP, rank 1 SIGKILLs itself after step 3; checkpoints every 2; --max-restarts 1
    save_crash   2 ranks FSDP, rank 1 raises in the middle of saving step 6 (after its shards are
                 written, before the checkpoint is published); checkpoints every 2; no restarts
    """
    j = Jobs(tmp_path_factory.mktemp("runs"), plans)
    j.start("ref_fsdp_tp", "fsdp_tp", "--checkpoint-every", "4")
    j.start("two_nodes", "fsdp_tp", nodes=2)
    j.start("ref_fsdp", "fsdp")
    j.start("killed", "fsdp", "--checkpoint-every", "2", "--max-restarts", "1",
            env={"MESHPLAN_FAULT": "kill_after_step:1:3"})
    j.start("save_crash", "fsdp", "--checkpoint-every", "2", env={"MESHPLAN_FAULT": "raise_in_save:1:6"})
    yield j
    j.kill_leftovers()


@pytest.fixture(scope="session")
def resumed(jobs) -> Jobs:
    """The runs that continue from others' checkpoints, started together once their sources ended:
    replan_fsdp  step-4 checkpoint of ref_fsdp_tp (4 ranks FSDP x TP) resumed on 2 ranks FSDP
    replan_pp    the same checkpoint resumed on 2 ranks PP 2 (1F1B)
    after_crash  save_crash's run directory, `--resume` (checked first: what the crash left)
    The state save_crash left is snapshotted into `crash_state` before after_crash touches it."""
    source = jobs["ref_fsdp_tp"].ok()
    for name in ("replan_fsdp", "replan_pp"):
        dest = jobs.root / name / "checkpoints" / "step-00000004"
        shutil.copytree(source.out / "checkpoints" / "step-00000004", dest)
    crash = jobs["save_crash"]
    crash.wait()
    jobs.crash_state = {"codes": list(crash.codes), "log": crash.text(),
                        "entries": sorted(p.name for p in (crash.out / "checkpoints").iterdir()),
                        "latest": latest(crash.out), "steps": [r["step"] for r in metrics(crash.out)]}
    jobs.start("replan_fsdp", "fsdp", "--resume")
    jobs.start("replan_pp", "pp", "--resume")
    jobs.start("after_crash", "fsdp", "--resume", "--checkpoint-every", "2", out=crash.out)
    return jobs
