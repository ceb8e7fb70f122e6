#!/usr/bin/env bash
# What a session with a lent GPU runs first (docs/cuda.md, "On a GPU"), as one call of the
# device tool, which gives a task 15 minutes of device time in all:
#
#   run(command="bash scripts/gpu_session.sh", carry=[".whl"], timeout_s=600)
#
# .whl holds the wheels the device image lacks (lark, islpy for CPython 3.12, gymnasium,
# farama-notifications: the device README says how to fetch them). Each stage has a time
# limit of its own and writes its whole output to $OUT/STAGE.log (the tool brings $OUT
# back); the last lines of each are printed. A stage that fails or runs out of time does not
# stop the next. Stages: the device; scripts/cuda_gpu_check.py (every program on the device
# against the cpu backend); the cuda tests and one conformance file on the device (8
# processes); scripts/cuda_overheads.py (the host's costs, the graphs' device time);
# "kernels": PPO's and REINFORCE's device time by function and product shape
# (cuda_overheads.py --kernels); "inflight" (not by default): cuda_sweep.py's
# --in-flight 1,4; "tilings" (not by default): cuda_skinny.py --tilings; "skinny": scripts/cuda_skinny.py (PPO's products by cuBLAS
# and by our kernels, cuda/products.py, apart from the program); scripts/bench.py at 2048x128 against jax on the GPU.
# "ab" (not by default): cuda_sweep.py's A/B of the twenty-third session's 16-byte
# shared-memory loads of rows products and grams against the 4-byte ones. "merged" (not by
# default): cuda_sweep.py's small grams adding their copies in their part function or not,
# and loops in a product's launch or not. "chain" (not by default): scripts/cuda_chain.py,
# a row-tile chain's probe (one network's backward in one kernel) against cuBLAS.
# "chains" (not by default): cuda_sweep.py without chains and with them as timed;
# "chains-tf32" (not by default) the same with TF32 products (the chains' TF32 functions).
# "remap" (not by default): cuda_sweep.py's chains (all run, --products ours) with their own
# buffers a tile at a time (the twenty-seventh session's _chain_remap) and without, float32
# and TF32: four builds of PPO 2048.
# "spread" (not by default): cuda_sweep.py with the twenty-eighth session's small reductions
# every block makes whole (render.SPREAD: a minibatch step's gradient norm and Adam updates
# one launch) and without, float32: two builds of PPO 2048.
# "soak" (not by default): scripts/cuda_soak.py --gpu, each program at sizes with many
# blocks, odd row counts and layers past 64 wide against the cpu backend (the twenty-ninth
# session's two bugs were at such sizes).
# "profile" (not by default): PPO at 2048 environments with --profile (each statement
# launched alone). "products" (not by default): scripts/cuda_sweep.py over PPO 2048 with
# its products as cuBLAS's or timed against ours, and its bias gradients riding on their
# grams or not (cuda/products.py). "check-tf32" (not by default): the check stage with TF32
# products. "kernels-tf32" (not by default): the kernels stage's PPO with TF32 products
# (ours, and the joint functions of a layer's gradient and its weight's). "sweep-tf32" (not
# by default): cuda_sweep.py with TF32 products, the joint functions and the kernels'
# fusion at equal launches (codegen.tree.SEQ_TIES) on and off. "ncu" (not by default, a GPU only): Nsight Compute's sections for the
# kernels NCU_KERNELS names (a regex), in PPO at the kernels stage's sizes (the names
# depend on them: at other sizes the plan and its functions differ).
#
#   bash scripts/gpu_session.sh --emu     # the same plumbing here, on cuda-emu and the CPU
#
# STAGES picks stages (default "check kernels bench": their limits sum to 520 s, one call
# of the device tool; "ncu" no longer by default since bench's limit grew to 360 s; on the
# H200, 2026-11-28, check took 36 s, kernels 57, and a bench of PPO alone about 260 s at
# two runs a system, before the chains of chains' compiles), BENCH_ALGOS and BENCH_CONFIGS the
# bench's grid (default PPO at 2048x128), BENCH_BASELINES its baselines (default jax, whose
# float32 products are TF32 on an H100, and jax-f32, true float32 as timerlc's: N = 2 was
# too noisy, 10 gives steadier figures). A session of 15 device minutes holds one such
# call and a short second one (a machine's start took about 35 s): e.g. STAGES="tests
# kernels-tf32 skinny" (160 s), or, after fixes, STAGES="check bench" again.
set -u
export PYTHONUNBUFFERED=1
STAGES=" ${STAGES:-check kernels bench} "
# (PPO alone by default: each run of a system at 2048x128 took about 32 s on the H200,
# start-up and compiles included, two runs a system, four systems; REINFORCE's too would
# not fit the stage's 300 s: BENCH_ALGOS=reinforce in a call of its own)
BENCH_ALGOS=${BENCH_ALGOS:-ppo}
BENCH_CONFIGS=${BENCH_CONFIGS:-2048x128}
BENCH_BASELINES=${BENCH_BASELINES:-jax,jax-f32}
# timerlc's --matmul-precision in the bench: both, as timerlc (float32, like jax-f32) and
# timerlc-tf32 (TF32, like jax: our TF32 products on the tensor cores, cuda/products.py)
BENCH_MATMUL=${BENCH_MATMUL:-float32,tensorfloat32}
# the long run at least this long (bench.py --min-diff-seconds): with N = 10 and 2N
# JAX's PPO took 2.7 ms an iteration in one call and 8.6 in another (an N run's window of
# 30-90 ms, its noise tens of ms); the long run is then N + M iterations, M as many as
# take 0.5 s by the N run's estimate, and each run's line is in bench.log as it ends (a
# stage stopped at its limit keeps those, and bench.json what ended)
BENCH_MIN_SECONDS=${BENCH_MIN_SECONDS:-0.5}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BACKEND=cuda DEVICE=cuda CHECK=()
if [ "${1:-}" = "--emu" ]; then
  BACKEND=cuda-emu DEVICE=cpu CHECK=(--emu)
fi
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || echo "warning: the wheels did not install"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

stage() {
  local name=$1 limit=$2 start rc
  shift 2
  case "$STAGES" in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name (at most ${limit} s)"
  start=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "   exit $rc after $(($(date +%s) - start)) s"
  tail -n 6 "$OUT/$name.log" | cut -c1-400
}

if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
  cat "$OUT/gpu.txt"
fi
# (the programs in three processes at once: NVRTC's compiles take most of the stage, and
# one process reached seven of nine programs in 90 s on the H100)
check_all() {
  local progs=(programs/*.rtl) groups=("" "" "") k pids=() rc=0
  for k in "${!progs[@]}"; do
    groups[k % 3]+=" $(basename "${progs[k]}" .rtl)"
  done
  for k in 0 1 2; do
    if [ -n "${groups[k]}" ]; then
      # shellcheck disable=SC2086
      $PY scripts/cuda_gpu_check.py $CHECK_FLAG ${CHECK_MATMUL:+--matmul-precision $CHECK_MATMUL} ${groups[k]} &
      pids+=($!)
    fi
  done
  for k in "${pids[@]}"; do wait "$k" || rc=1; done
  return $rc
}
CHECK_FLAG="${CHECK[*]}"
export -f check_all
export PY CHECK_FLAG
stage check 100 bash -c check_all
# (not by default: every program with the device's float32 products in TF32, ours' TF32
# functions on the tensor cores where faster, against the cpu backend within 1e-2)
stage check-tf32 100 env CHECK_MATMUL=tensorfloat32 bash -c check_all
stage tests 60 env TIMERLC_TEST_BACKEND=$BACKEND TIMERLC_REQUIRE_NVCC=0 \
  $PY -m pytest -q -n 8 --maxfail=10 -p no:cacheprovider tests/test_cuda_graphs.py tests/test_cuda.py \
  tests/test_cuda_runtime.py tests/test_language_operators.py
stage profile 60 $PY -m timerlc.cli run programs/ppo.rtl --backend $BACKEND --set B=2048 \
  --set T=128 --set total_steps=786432 --no-progress --profile
stage overheads 80 $PY scripts/cuda_overheads.py "${CHECK[@]}" --set B=2048 --set T=128 \
  --set total_steps=1572864
stage kernels 60 bash -c "$PY scripts/cuda_overheads.py ${CHECK[*]} --kernels --top 80 \
  --set B=2048 --set T=128 --set total_steps=1572864 && $PY scripts/cuda_overheads.py \
  ${CHECK[*]} --kernels --program reinforce --set B=2048 --set T=128 --set I=6"
# (not by default: PPO's kernels with TF32 products, ours and the joint ones where faster)
stage kernels-tf32 60 $PY scripts/cuda_overheads.py "${CHECK[@]}" --kernels --top 80 \
  --matmul-precision tensorfloat32 --set B=2048 --set T=128 --set total_steps=1572864
# PPO's skinny products: cuBLAS (float32, TF32) against ours (cuda/products.py)
stage skinny 40 $PY scripts/cuda_skinny.py "${CHECK[@]}"
# (not by default: a row-tile chain's probe, one MLP's backward over a tile of rows at a time
# in one kernel, against cuBLAS's five products of it: scripts/cuda_chain.py, ~30 s)
stage chain 60 $PY scripts/cuda_chain.py "${CHECK[@]}" --parts 256,512,1024
# (not by default: PPO 2048 without chains, with chains in static shared memory only
# (CHAIN_SMEM_FLOATS 12000) and with chains of chains (25600, the default), each as the
# runtime times it: three runs, ~60 s each; a run prints each chain's two times)
stage chains 240 bash -c "$PY scripts/cuda_sweep.py ${CHECK[*]} --products fastest --chains 0 \
  --set B=2048 --set T=128 --set total_steps=786432 && $PY scripts/cuda_sweep.py ${CHECK[*]} \
  --products fastest --chain-floats 12000,25600 --set B=2048 --set T=128 \
  --set total_steps=786432"
# (not by default: the same with TF32 products: the chains' TF32 functions, ChainCall.tf32,
# against the launches with their TF32 products)
stage chains-tf32 240 bash -c "$PY scripts/cuda_sweep.py ${CHECK[*]} --matmul-precision \
  tensorfloat32 --products fastest --chains 0 --set B=2048 --set T=128 \
  --set total_steps=786432 && $PY scripts/cuda_sweep.py ${CHECK[*]} --matmul-precision \
  tensorfloat32 --products fastest --chain-floats 12000,25600 --set B=2048 --set T=128 \
  --set total_steps=786432"
# (not by default: the chains' own buffers a tile at a time in the chunk's first tile's
# rows, CHAIN_REMAP, against the whole buffers, float32 and TF32; the chains all run)
stage remap 300 bash -c "$PY scripts/cuda_sweep.py ${CHECK[*]} --products ours \
  --chain-remap 0,1 --set B=2048 --set T=128 --set total_steps=786432 && \
  $PY scripts/cuda_sweep.py ${CHECK[*]} --matmul-precision tensorfloat32 --products ours \
  --chain-remap 0,1 --set B=2048 --set T=128 --set total_steps=786432"
# (not by default: the small reductions every block makes whole, SPREAD, against the
# launch after the reduction's; float32)
stage spread 200 $PY scripts/cuda_sweep.py "${CHECK[@]}" --spread 0,1 --set B=2048 \
  --set T=128 --set total_steps=786432
# (not by default: the programs at sizes the tests do not take, against the cpu backend)
SOAK_FLAG="--gpu"
[ "$DEVICE" = cuda ] || SOAK_FLAG=""
stage soak 300 $PY scripts/cuda_soak.py $SOAK_FLAG
# (not by default: our float32 rows products with each thread's tile of C forced, TM x TN;
# the default is 4 x 8 for PPO's 64-wide layers, at a quarter of the bandwidth on the H200)
stage tilings 60 $PY scripts/cuda_skinny.py "${CHECK[@]}" --tilings 4x8,2x8,1x8,4x4,8x4,2x4,4x2
# PPO 2048's minibatch step with cuBLAS's products only (no gram sums, no epilogues), then
# with ours where faster, the bias gradients on the grams or not, the layers' epilogues in
# the rows products or not (a build and a run each)
stage products 200 bash -c "$PY scripts/cuda_sweep.py ${CHECK[*]} --products blas \
  --gram-sums 0 --epilogues 0 --set B=2048 --set T=128 --set total_steps=1572864 && \
  $PY scripts/cuda_sweep.py ${CHECK[*]} --products fastest --gram-sums 0,1 --epilogues 0,1 \
  --set B=2048 --set T=128 --set total_steps=1572864"
# (not by default: the same with TF32 products, the joint functions of a layer's gradient
# and its weight's on and off, calls joined into kernels at equal launches or not)
stage sweep-tf32 200 $PY scripts/cuda_sweep.py "${CHECK[@]}" --matmul-precision tensorfloat32 \
  --products fastest --joints 0,1 --fuse-ties 0,1 --set B=2048 --set T=128 \
  --set total_steps=1572864
# (not by default: PPO 2048's device time with a grid loop's points of stores alone one
# after another, IN_FLIGHT 1, and four at a time, 4, their loads before their stores:
# cuda/render.py's _Kernel.batched, 2026-11-28, not yet timed)
stage inflight 150 $PY scripts/cuda_sweep.py "${CHECK[@]}" --in-flight 1,4 --top 6 \
  --set B=2048 --set T=128 --set total_steps=1572864
# (not by default: the twenty-third session's changes, none yet timed, against what they
# replaced: rows products' and grams' shared memory read 16 bytes at a time or 4
# (products.VEC_ROWS, VEC_GRAMS); four builds and runs of PPO 2048. The permutation by
# buckets against the merge sort: --perm-buckets 0,2048, or the kernels stage's s119s)
stage ab 160 $PY scripts/cuda_sweep.py "${CHECK[@]}" --vec-rows 0,1 --vec-grams 0,1 \
  --top 6 --set B=2048 --set T=128 --set total_steps=1572864
# (not by default: the twenty-fourth session's small grams that add their copies in their
# part function, products.MERGED_SUMS 256, against a sum launch of their own, 0, and loops
# in a product's launch, render.BESIDE 1, or in their own, 0; four builds and runs of PPO
# 2048, the runtime timing ours against the BLAS as a run does)
stage merged 180 $PY scripts/cuda_sweep.py "${CHECK[@]}" --products fastest \
  --merged-sums 0,256 --beside 0,1 --top 6 --set B=2048 --set T=128 --set total_steps=1572864
# Nsight Compute (on the device image's PATH) over the kernels NCU_KERNELS names (a regex of
# function names, which depend on the program's sizes: these are the kernels stage's PPO's),
# the first call of each: where a kernel's time goes (memory, occupancy, stalls); by
# default a gram of ours with its bias gradient's column sums (f530_35_1p, then its sum
# f530_35_1s; or, where the BLAS's runs, the column sums after it, f530_35_1e), rows
# products with their epilogues (`1 - h^2`: f530_35_0r; `tanh`: s142_0r) and one without
# (f146_22_0r), and the joint function of a layer's gradient and its weight's (f530_35_0j,
# with TF32 products only) (the names of 2026-11-27's sixteenth session); and the two
# fused kernels of many statements that take far longer than their bytes on the H200
# (2026-11-28): the minibatch step's parameter copies from the last step's (f0_121: 27,463
# floats in 38.6 us) and Adam's update with the gradient's norm (f248_58: 26.8 us); and an
# elementwise pass over 65,536 x 64 floats whose points now go four at a time (f481_33:
# 16-23 us, 2026-11-28, at a third of the bandwidth)
# (a fused kernel's name is its first statement's and the count of kernels fused before it,
# which moves when the fusion does: the count matched by any number. Since the twenty-second
# session's narrowing the statements are numbered anew: the 64 x 64 gram with its sums is
# f530_N_1p/1s/1e, the rows product with `1 - h^2` f530_N_2r, the joint f530_N_1j, the
# forward's rows products with `tanh` f142_N_0r and f142_N_1r, the elementwise pass of four
# points a thread f476_N, Adam's f248_N, the parameters' copies f0_N). Since the
# twenty-third session's cut of the value head's gradient out of its row loop: the 64 x 64
# gram with its sums f521_N_0p/0s (the BLAS's then the sums: 0e), the rows product with
# `1 - h^2` f521_N_1r (the vector form), the value loss's rows f172_N and the elementwise
# pass it left, in f530_N; the permutation by buckets' count s119 and sort s119_3). Since the
# twenty-sixth session's chains of chains: the minibatch step's whole forward and backward
# f121_N_5o (float32; TF32 f121_N_5ot), its inner chains f121_N_Mc, the parameters' copies
# f283_N, the advantages' gathers and sums f121_N and f121_N_3, Adam's f248_N and f307_N)
NCU_KERNELS=${NCU_KERNELS:-f121_[0-9]+_5o|f121_[0-9]+_5ot|f121_[0-9]+_[0-9]+c|f121_[0-9]+|f121_[0-9]+_3|f283_[0-9]+|f248_[0-9]+|f307_[0-9]+|s119|s119_3}
if [ "$DEVICE" = cuda ] && command -v ncu >/dev/null; then
  # (--launch-count is of all the launches the regex matches, in their order: 16 covers
  # each name's first launches, most of them in the first minibatch step; it was 3, which
  # profiled the first three launches only)
  stage ncu 90 ncu --kernel-name "regex:^(${NCU_KERNELS})\$" --launch-count 16 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section LaunchStats \
    $PY -m timerlc.cli run programs/ppo.rtl --backend cuda --set B=2048 --set T=128 \
    --set total_steps=1572864 --no-progress
fi
# (BENCH_MATMUL may name both precisions, "float32,tensorfloat32": one bench, timerlc run
# twice, as timerlc and timerlc-tf32, against the same runs of the baselines; 360 s: since
# the chains of chains, 2026-11-29, PPO 2048's module compiles some 9 s longer here with
# float32 products, once: CuPy keeps the compiled module for the second run)
stage bench 360 $PY scripts/bench.py --device $DEVICE --backend $BACKEND --algos "$BENCH_ALGOS" \
  --configs "$BENCH_CONFIGS" --iters 10 --repeats 1 --min-diff-seconds "$BENCH_MIN_SECONDS" \
  --baselines "$BENCH_BASELINES" --matmul-precision "$BENCH_MATMUL" --json "$OUT/bench.json"
