#!/usr/bin/env bash
# A third lent-GPU call for issue 28: the eager host cost per op on the GPU machine's host
# (benchmarks/host_costs.py), then moe-1b under more AC and micro-batch settings (10 steps, 8 timed),
# rows to check a host-priced estimate on. LIMIT_S (default 200) is the call's own deadline.
#
#   device run, carry [".whl"], timeout 240:   bash benchmarks/gpu_host_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
limit="${LIMIT_S:-200}"
res=/tmp/host_session_out
mkdir -p "$res"
trap 'tar czf "${OUT:-benchmarks/results}/gpu_host_session.tgz" -C "$res" .' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
timeout 40 python3 benchmarks/host_costs.py --out "$res" || echo "host_costs failed"
plans=benchmarks/plans
for name in ac_none ac_none_mb1 ac_full_mb1 ac_selective; do
  [ $((limit - SECONDS)) -gt 45 ] || break
  timeout $((limit - SECONDS - 5)) python3 -m meshplan run --plan "$plans/moe-1b-$name.yaml" --steps 10 \
    --no-final-checkpoint --quiet --out "/tmp/moe_runs/$name" > "$res/$name.log" 2>&1 || echo "$name failed"
  cp "/tmp/moe_runs/$name/summary.json" "$res/$name-summary.json" 2>/dev/null
  cp "/tmp/moe_runs/$name/metrics.jsonl" "$res/$name-metrics.jsonl" 2>/dev/null
  python3 -c "import json; print('$name', json.load(open('$res/$name-summary.json'))['measured']['step_time_s'])" 2>/dev/null
done
