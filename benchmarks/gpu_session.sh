#!/usr/bin/env bash
# One lent-GPU call (../shared/gpu/README.md): install the wheels the image lacks, then gpu_truth on
# llama3.2-3b (the planner's top 3, AC full compiled, each beside its eager twin) within the time a
# call allows, and bring back the table, the CSV and every run's log.
#
#   device run, carry [".whl"], timeout 540:   bash benchmarks/gpu_session.sh
#
# MOE_BUDGET_S (default 90; 0 skips it) first runs the planner's top 2 plans of moe-1b (0.92B parameters,
# EP 1 on one GPU, eager) through gpu_truth, into tables of their own under $OUT/moe: issue 29's GPU check.
# BUDGET_S (default 270) then stops new 3B runs; each takes about 35 s plus its compile. On 2 or more GPUs the
# 3B runs include async TP on and off (issue 26: the table's "TP ops fused/left" column must show fused ops). Then the saved
# tensors of one block (benchmarks/saved_tensors.py) and a profiled step of the pick and of AC full
# (their top ops by GPU time): about 2 more minutes, so keep MOE_BUDGET_S + BUDGET_S + 150 under the
# call's limit (540 s).
# benchmarks/grouped_gemm.py times the MoE grouped GEMM grid (about 20 s) and the published MoE rows' shapes
# (about 15 s) between the two.
# Outputs go to $OUT (the device tool's folder), or benchmarks/results when run elsewhere.
set -uo pipefail
cd "$(dirname "$0")/.."
# The device tool brings back at most 8 files, so on it everything is written to one folder and packed
# into $OUT/gpu_session.tgz at exit; LIMIT_S (default 480) is the call's own deadline: a step starts only
# when the time left allows it, so the pack happens before the tool's timeout kills the call.
limit="${LIMIT_S:-480}"
left() { echo $((limit - SECONDS)); }
if [ -n "${OUT:-}" ]; then
  out=/tmp/gpu_session_out
  mkdir -p "$out"
  trap 'tar czf "$OUT/gpu_session.tgz" -C "$out" . && cp "$out"/*.md "$OUT"/ 2>/dev/null' EXIT
else
  out=benchmarks/results
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
# pulp's bundled CBC (cbcbox's binary is too large to carry): executable, and on PATH.
cbc_dir=/tmp/site/pulp/solverdir/cbc/linux/i64
chmod +x "$cbc_dir/cbc" 2>/dev/null && export PATH="$cbc_dir:$PATH"
nvidia-smi --query-gpu=name,memory.total --format=csv
# The host cost per op: bench/host.py's chains and the runtime's own blocks, and from them moe_op_s and its
# ratio to the chain (cost_models/host.py MOE_OP_COST_RATIO: 2.18 and 1.78 on two H200 machines' hosts; ~10 s).
timeout 60 python3 benchmarks/host_costs.py --out "$out" || echo "host_costs failed"
# The host link profile-cluster times (bench/compute.py bench_host_link, device.host_link_gbs; ~2 s), one GPU alone.
timeout 30 python3 -c "
import torch
from meshplan.bench import compute
from meshplan.bench.env import BenchEnv
env = BenchEnv(rank=0, world=1, local_rank=0, local_world=1, nnodes=1, backend='nccl', device=torch.device('cuda', 0))
print(torch.cuda.get_device_name(0), compute.bench_host_link(env, compute.ComputeSettings(0.3, 5)))
" > "$out/host_link.txt" 2>&1 || echo "host_link failed"
work=/tmp/gpu_truth_work
if [ "${MOE_BUDGET_S:-90}" != 0 ]; then
  python3 benchmarks/gpu_truth.py --no-profile --models moe-1b --top 2 --steps 6 --budget-s "${MOE_BUDGET_S:-90}" \
    --out "$out/moe" --work /tmp/gpu_truth_moe || echo "moe-1b gpu_truth failed"
  mkdir -p "$out/moe" && tar czf "$out/moe/gpu_truth_logs.tgz" -C /tmp/gpu_truth_moe runs plans 2>/dev/null
fi
# The routed experts' grouped GEMMs against the built-in profile's per-expert matmuls (issue 28; ~20 s).
timeout 50 python3 benchmarks/grouped_gemm.py --quick --out "$out" > /dev/null 2>&1 || echo "grouped_gemm failed"
# The published MoE rows' expert GEMMs (Mixtral's wide experts beyond the grid, 16-32 groups) against the
# profile's grouped form (~15 s): does the form hold where the validation rows need it?
timeout 40 python3 benchmarks/grouped_gemm.py --rows --out "$out" > /dev/null 2>&1 || echo "grouped_gemm --rows failed"
python3 benchmarks/gpu_truth.py --no-profile --models "${MODELS:-llama3.2-3b}" --top "${TOP:-3}" \
  --variants activation_checkpointing=full async_tp=True async_tp=False --steps 6 --budget-s "${BUDGET_S:-270}" --out "$out" --work "$work"
status=$?
tar czf "$out/gpu_truth_logs.tgz" -C "$work" runs plans 2>/dev/null
# What one block keeps for backward on this GPU, against the inventory (about 40 s).
[ "$(left)" -gt 120 ] && timeout $(( $(left) - 60 )) python3 benchmarks/saved_tensors.py --out "$out" > /dev/null 2>&1 || echo "saved_tensors failed"
# Where a step's time goes, for the pick and for AC full (the priced recompute is about twice what the
# H200 measured at 540f8e8): one profiled step each, the top ops by GPU time (PROFILE_OPS=0 skips it).
if [ "${PROFILE_OPS:-1}" = 1 ]; then
  for name in llama3.2-3b-planner_1 "llama3.2-3b-variant_activation_checkpointing=full"; do
    plan="$work/plans/$name.yaml"
    [ -f "$plan" ] || continue
    [ "$(left)" -gt 50 ] || break
    timeout $(( $(left) - 15 )) python3 -m meshplan run --plan "$plan" --steps 4 --profile-steps 1 --no-final-checkpoint --quiet \
      --out "$work/profile/$name" > /dev/null 2>&1 && cp "$work/profile/$name"/profile/rank0_step*_ops.txt "$out/ops-$name.txt"
  done
fi
exit $status
