#!/usr/bin/env bash
# One device call: GPU tests, then each benchmark under its own time limit. Results go to
# $RES (tarred into $OUT/results.tgz, since the device tool returns at most 8 files).
#   STEPS="tests rms rms_sweep gemm_fp8 ..." bash benchmarks/device_suite.sh
set -u
export PYTHONPATH=$PWD TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
RES=${RES:-/tmp/fxfuse_results}
OUT=${OUT:-$RES}
mkdir -p "$RES"
STEPS=${STEPS:-"tests rms gemm_fp8 gemm_mxfp4 split_cat topk layer"}
step() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${secs}s)"
  timeout "$secs" "$@" >"$RES/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-40}" "$RES/$name.log"
  echo "=== $name rc=$rc in $(( $(date +%s) - t0 ))s"
  pack  # after every step: a call cut off by its time limit still brings back what ran
}
pack() { [ "$OUT" = "$RES" ] || tar czf "$OUT/results.tgz" -C "$RES" . ; }
install_sm90() {  # table, sweep JSON[, key of the sm90 spec in it]: replace, validate, keep a copy
  python - "$@" <<'PY'
import json, sys
from fxfuse.runtime.launch_tables import _validate
name, sweep = sys.argv[1], json.load(open(sys.argv[2]))
path = f"fxfuse/runtime/tables/{name}.json"
table = json.load(open(path))
table["targets"]["sm90"] = sweep[sys.argv[3]] if len(sys.argv) > 3 else sweep
_validate(table, name)
json.dump(table, open(path, "w"), indent=2)
PY
  local rc=$?
  cp "fxfuse/runtime/tables/$1.json" "$RES/$1_table.json"
  echo "=== $1 sm90 table installed rc=$rc"
}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for s in $STEPS; do
  case $s in
    tests) step tests "${T_TESTS:-120}" python -m pytest -q -p no:cacheprovider ${TEST_FILES:-tests/kernels} -k "gpu or cuda" ;;
    gputests) step gputests "${T_TESTS:-150}" python -m pytest -q -p no:cacheprovider -m gpu ${GPU_TEST_FILES:-tests} ;;
    rms) step rms "${T_RMS:-90}" python benchmarks/bench_rms_norm_quant.py --out "$RES" ;;
    rms_sweep) step rms_sweep "${T_RMS_SWEEP:-150}" python benchmarks/bench_rms_norm_quant.py --sweep --out "$RES" ;;
    gemm_fp8) step gemm_fp8 "${T_GEMM:-80}" python benchmarks/bench_gemm_fp8.py ${GEMM_ARGS:-} --out "$RES" ;;
    gemm_fp8_sweep) step gemm_fp8_sweep "${T_GEMM_SWEEP:-150}" python benchmarks/bench_gemm_fp8.py --sweep ${GEMM_SWEEP_ARGS:-} --out "$RES" ;;
    gemm_fp8_install)  # the sweep's best configs into the sm90 table, before timing with it
      python benchmarks/install_gemm_sweep.py gemm_fp8 "$RES/gemm_fp8_sweep.json" \
        && cp fxfuse/runtime/tables/gemm_fp8.json "$RES/gemm_fp8_table.json"; echo "=== gemm_fp8_install rc=$?" ;;
    gemm_mxfp4) step gemm_mxfp4 "${T_MX:-80}" python benchmarks/bench_gemm_mxfp4.py ${MX_ARGS:-} --out "$RES" ;;
    gemm_mxfp4_sweep) step gemm_mxfp4_sweep "${T_MX_SWEEP:-150}" python benchmarks/bench_gemm_mxfp4.py --sweep ${MX_SWEEP_ARGS:-} --out "$RES" ;;
    gemm_mxfp4_install)  # each table whose sweep ran (A16WFP4 for M <= 128, AFP4WFP4 above)
      for t in gemm_a16wfp4 gemm_mxfp4; do
        [ -f "$RES/${t}_sweep.json" ] || continue
        python benchmarks/install_gemm_sweep.py $t "$RES/${t}_sweep.json" \
          && cp fxfuse/runtime/tables/$t.json "$RES/${t}_table.json"; echo "=== $t install rc=$?"
      done ;;
    split_cat) step split_cat "${T_SPLIT:-200}" python benchmarks/bench_gemm_split_cat.py ${SPLIT_ARGS:-} --out "$RES" ;;
    split_cat_quant) step split_cat_quant "${T_SPLIT_QUANT:-200}" python benchmarks/bench_gemm_split_cat_quant.py ${SPLIT_QUANT_ARGS:-} --out "$RES" ;;
    split_cat_sweep) step split_cat_sweep "${T_SPLIT_SWEEP:-120}" python benchmarks/bench_gemm_split_cat.py --sweep-only ${SPLIT_SWEEP_ARGS:-} --out "$RES" ;;
    split_cat_install)  # the sweep's sm90 entries into the table before timing with it
      install_sm90 gemm_split_cat "$RES/gemm_split_cat_sweep_sm90.json" ;;
    topk) step topk "${T_TOPK:-70}" python benchmarks/bench_topk.py --budget-s ${TOPK_BUDGET:-55} ${TOPK_ARGS:-} --out "$RES" ;;
    topk_bf16)  # the page transform over bf16 scores (their k-th score ties), into $RES/bf16
      step topk_bf16 "${T_TOPK:-70}" python benchmarks/bench_topk.py --dtype bf16 --no-families \
        --budget-s ${TOPK_BUDGET:-55} ${TOPK_ARGS:-} --out "$RES/bf16" ;;
    topk_isample)  # the sample estimate by interpolated counts (MULTI_INTERP 2) against the table
      step topk_isample "${T_ISAMPLE:-150}" python benchmarks/experiments/topk_occupancy.py \
        --variants table,isample --shapes 256x131072,64x131072,1x131072,16384x17920 --out "$RES" ;;
    stream) step stream "${T_STREAM:-90}" python benchmarks/experiments/stream_read.py --out "$RES" ;;
    read_floor) step read_floor "${T_FLOOR:-60}" python benchmarks/experiments/weight_read_floor.py --out "$RES" ;;
    rms_midm) PYTHONPATH=$PWD:$PWD/benchmarks step rms_midm "${T_MIDM:-150}" python benchmarks/experiments/rms_midm_probe.py ;;
    layer_profile) step layer_profile "${T_PROFILE:-150}" python benchmarks/experiments/layer_profile.py ${PROFILE_ARGS:-} ;;
    oneshot) step oneshot "${T_ONESHOT:-90}" python benchmarks/experiments/oneshot_world1.py --out "$RES" ;;
    quant_only) step quant_only "${T_QONLY:-120}" python benchmarks/experiments/quant_only.py --out "$RES" ;;
    probe) step probe "${T_PROBE:-150}" python benchmarks/experiments/rms_fp8_probe.py ;;
    rms_table)  # install the sweep's sm90 table before timing with it
      install_sm90 rms_norm_quant "$RES/rms_norm_quant_sweep.json" sm90 ;;
    chain) step chain "${T_CHAIN:-150}" python benchmarks/bench_chain.py ${CHAIN_ARGS:-} --out "$RES" ;;
    decode_rows) step decode_rows "${T_DECODE_ROWS:-200}" python benchmarks/experiments/decode_rows.py ${DECODE_ROWS_ARGS:-} --out "$RES" ;;
    decode_tables)  # the A16WFP4 decode's table operands: GPU-checked (tests), then timed
      step decode_tables_tests "${T_TESTS:-120}" python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gemm_mxfp4_kernel.py -k decode_and_swap
      step decode_tables "${T_DECODE_ROWS:-200}" python benchmarks/experiments/decode_rows.py --tables --cases a16wfp4 --m ${DECODE_TABLES_M:-1,16,32} --out "$RES" ;;
    packed) step packed "${T_PACKED:-150}" python benchmarks/experiments/packed_prefill.py ${PACKED_ARGS:-} --out "$RES" ;;
    demo) step demo "${T_DEMO:-90}" python -m fxfuse demo ;;
    layer) step layer "${T_LAYER:-60}" python benchmarks/bench_layer.py ${LAYER_ARGS:-} --out "$RES" ;;
    *) echo "unknown step $s" ;;
  esac
done
pack && echo "results in results.tgz: $(ls "$RES" | tr '\n' ' ')"
