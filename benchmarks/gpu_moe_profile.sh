#!/usr/bin/env bash
# A second lent-GPU call for issue 28: where moe-1b's step goes on one GPU (the estimate priced it at a
# third of what gpu_session.sh measured). Runs the planner's pick with learned routing and with
# balanced routing, and AC full, 10 steps each with one profiled step; the top-ops tables, each
# step's GPU-busy share (benchmarks/trace_busy.py) and the summaries come back packed in one file.
#
#   device run, carry [".whl"], timeout 300:   bash benchmarks/gpu_moe_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
res=/tmp/moe_profile_out
mkdir -p "$res"
trap 'tar czf "${OUT:-benchmarks/results}/gpu_moe_profile.tgz" -C "$res" .' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
cbc_dir=/tmp/site/pulp/solverdir/cbc/linux/i64
chmod +x "$cbc_dir/cbc" 2>/dev/null && export PATH="$cbc_dir:$PATH"
plans=benchmarks/plans
for case in "pick:$plans/moe-1b-planner_1.yaml:" "pick_balanced:$plans/moe-1b-planner_1.yaml:--balanced-routing" \
            "ac_full:$plans/moe-1b-ac_full.yaml:"; do
  IFS=: read -r name plan extra <<< "$case"
  timeout 100 python3 -m meshplan run --plan "$plan" --steps 10 --profile-steps 1 --no-final-checkpoint --quiet \
    $extra --out "/tmp/moe_runs/$name" > "$res/$name.log" 2>&1 || echo "$name failed"
  cp /tmp/moe_runs/$name/summary.json "$res/$name-summary.json" 2>/dev/null
  cp /tmp/moe_runs/$name/metrics.jsonl "$res/$name-metrics.jsonl" 2>/dev/null
  cp /tmp/moe_runs/$name/profile/rank0_step*_ops.txt "$res/$name-ops.txt" 2>/dev/null
  python3 benchmarks/trace_busy.py /tmp/moe_runs/$name/profile/rank0_step*.json > "$res/$name-busy.json" 2>&1
  cat "$res/$name-busy.json"
done
