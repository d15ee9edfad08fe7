#!/usr/bin/env bash
# The GPU measurements of the "fast on a GPU" acceptance, one stage per call of at most 10 minutes.
#
#   bench/gpu_acceptance.sh STAGE [OUT]
#
# OUT (default $OUT, else results/gpu) receives each stage's log and JSON. A session's device time
# (15 minutes, the machine's start included) holds one long stage and perhaps a short one. multi30k ran
# on an H200 on 2026-11-26 (bench/MEASUREMENTS.md), then graphs (CUDA graphs: the rows compiled with
# dynamic shapes died of a segmentation fault, a graph per batch shape trained, which train.compile_dynamic
# auto now chooses); updates (its speed rows, to the Transformer-base ones) and experiments (TRAIN_SECONDS=240)
# on 2026-11-27; in a second session that day, first (287 s) and experiments with recorded updates in bf16, whose
# RNNs went wrong after their first validation (recorded cuDNN kernels; recorded updates now run without
# cuDNN). Run first next (DEADLINE=480: its GPU tests and RNN rows check that change), then the RNNs again with
# EXPERIMENTS="multi30k_rnn_bahdanau multi30k_rnn_luong_general multi30k_rnn_noattn" TRAIN_ARGS="--set
# train.cuda_graphs=true --set train.precision=bf16" experiments, then updates (its toy trainings, the rows
# over lengths a multiple of 8, the reduction bench), rnn-updates, updates-compiled, graphs, speed, multi30k
# (again: its Transformer now records its updates by default, train.cuda_graphs auto), tests and compiled.
# Where OUT is the device tool's $OUT, which brings back at most 8 files, what a stage writes besides its log
# is packed into OUT/STAGE-files.tar.gz as it ends. Stages:
#
#   first      for a session of 15 device minutes, with DEADLINE=480: the first four rows of updates (the
#              targets), every test marked gpu, the no-attention RNN trained 700 updates eagerly and with
#              recorded updates side by side, the RNN encoder bench, the Bahdanau, Luong and no-attention
#              RNNs eager and recorded (as rnn-updates), the Multi30k shape in fp16 (autocast, then on an
#              fp16 copy) and bf16 under autocast, eager and recorded, then Transformer-base at news
#              corpora's lengths with sentences side by side (attention_pack)
#                                                                          (about 9 min, DEADLINE trims it)
#   speed      train_speed eager rows: Multi30k shape and Transformer-base, fp32 / bf16 (bf16 copy of the
#              weights) / bf16-autocast, with a 10-update profile of each row; the Multi30k shape's fp32
#              and bf16 with lengths not rounded up, then in relative steps, in both batch orders
#              (train.batch_order); the host time of the bf16 copy's bookkeeping per update
#              (bench/half_copy_speed.py)                                               (about 8 min)
#   compiled   fp32 and bf16 rows with train.compile on, default mode (warm-up includes compilation);
#              then the Bahdanau RNN eager and compiled (its decoder step)              (about 8 min)
#   graphs     rows compiled in reduce-overhead mode: CUDA graphs over static batch shapes (train.batch_shapes
#              auto), a graph per length bucket (train.compile_dynamic auto): the Multi30k shape in fp32
#              and bf16, Transformer-base in bf16 (the acceptance rows, each with a profile whose host time
#              per phase says where bf16 loses what its kernels gain); Transformer-base again with attention
#              left to the compiler (--attention math), then with cuDNN's attention allowed; then the
#              Multi30k shape in bf16 with lengths not rounded up (a graph per length)  (about 9 min)
#   updates    first the rows that decide the targets: train.cuda_graphs (each batch shape's whole update
#              recorded as one CUDA graph) against eager at the Multi30k shape in fp32 and bf16, with
#              profiles, then recorded with sentences side by side in rows of 128 positions
#              (model.transformer.attention_pack); Transformer-base in bf16 with it, on Multi30k's sentences
#              then on pairs of them joined (bench/train_speed.py --join 2: news corpora's lengths), and
#              side by side. Then flash, memory-efficient,
#              variable-length, packed-row and side-by-side attention alone at Transformer-base's batches
#              of 16 to 512 positions (bench/attention_speed.py); the bf16 rows with flash tried first,
#              torch's order (--attention flash,efficient,math); the Multi30k rows over lengths a multiple
#              of 8; the column sums of the gradients, each way (bench/reduction_speed.py); the GPU tests
#              of the loss, the kernels, the Transformer and recorded updates (the stage stops if the last
#              fail); then a toy training with recorded updates, resumed, and one with train.accumulate 2
#                                                                                        (about 8 min)
#   rnn-updates  the RNN encoder packed and unpacked (bench/rnn_encoder_speed.py) and its GPU tests; the
#              Bahdanau (GRU) and Luong (LSTM) RNNs in fp32 and bf16, eager and with train.cuda_graphs, with
#              profiles; the GPU tests of the RNNs' recorded updates; a toy
#              RNN trained with recorded updates, then resumed; then the Bahdanau RNN's recorded updates over
#              its compiled decoder step                                                  (about 5 min)
#   updates-compiled  train.cuda_graphs over a compiled model (default mode, a compilation per batch
#              shape): the Multi30k shape in fp32 and bf16, then Transformer-base in bf16, then with
#              attention as plain matrix products (--attention math)                     (about 8 min)
#   multi30k   `nmt experiment configs/multi30k_transformer.yaml` in bf16 for 270 s of training (TRAIN_ARGS
#              adds --set options, e.g. "--set train.compile=true --set train.compile_mode=reduce-overhead"), scored
#              on both test sets; then bench/decode_speed.py on its checkpoint: beam 5 on test_2016_flickr,
#              first on the CPU (outputs kept), then on CUDA in fp32 and bf16, 3 rounds each, counted
#              against the CPU's lines, with a profile; then the test set 20 times over as one file, in
#              chunks sized by the batch budget and in chunks of 2,000 lines            (about 8 min)
#   experiments  the six Multi30k experiments of `make multi30k-all` (the Transformer with dropout 0.3 and
#              0.1, en-de Transformer, Bahdanau, Luong and no-attention RNNs) side by side on the one GPU,
#              each `nmt experiment` in fp32 (a Transformer's updates recorded: train.cuda_graphs auto) for
#              TRAIN_SECONDS (default 480 here: 240 s on 2026-11-27 left the RNNs still improving; the whole
#              stage took 30 s more than its training) with its
#              log in OUT/NAME.log, scored on both test sets; then their results table. EXPERIMENTS names
#              others                                                                   (about 9 min)
#   tests      the tests that only run on CUDA, the distributed tests on one GPU, training with
#              --set train.device=cuda:0, an RNN trained in bf16 (cuDNN's bf16 RNN), and what a checkpoint
#              costs the loop (bench/checkpoint_speed.py)                                (about 3 min)
#
# DEVICE (default cuda), TRAIN_SECONDS (default 270; 480 in experiments) and STEPS (timed updates per speed
# row, default 50) let a stage be tried on a CPU first, e.g. DEVICE=cpu TRAIN_SECONDS=30 bench/gpu_acceptance.sh multi30k /tmp/try.
# TRAIN_ARGS adds --set options to every stage's training, e.g. TRAIN_ARGS="--set train.pad_to_multiple=1".
# DEADLINE (seconds since the stage began) skips, and names, the commands a stage would start after it; LIMIT
# (default DEADLINE + 70, none without DEADLINE) stops a command still running then (SIGTERM, SIGKILL 10 s
# later), so that a stage whose last command hangs or runs long still ends before its call, its files packed.
# A stage exits 1 if any of its commands failed (each one's status is in its log).
#
# On a machine without package registry access, prepare the checkout with the project's
# gpu-prepare script, carry .gpu, and run: source .gpu/env.sh && bench/gpu_acceptance.sh STAGE
set -uo pipefail
stage=${1:?usage: bench/gpu_acceptance.sh first|speed|compiled|graphs|updates|rnn-updates|updates-compiled|multi30k|experiments|tests [OUT]}
out=${2:-${OUT:-results/gpu}}
py=${PYTHON:-python3}
data=${NMT_DATA:-../shared/data/multi30k}
device=${DEVICE:-cuda}
seconds=${TRAIN_SECONDS:-270}
steps=${STEPS:-50}
deadline=${DEADLINE:-0}
limit=${LIMIT:-$((deadline ? deadline + 70 : 0))}
failed=0
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$out/gpu.txt" 2>&1
git log -1 --format='%h %s' > "$out/commit.txt" 2>/dev/null

# A command that dies of a signal prints nothing itself: Python's fault handler dumps every thread's stack
# on SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL, and `run` logs each failing command's exit status.
# Unbuffered output: into a pipe Python holds stdout back, and a process killed by a signal loses what it
# held (train_speed's rows go to stderr as each is measured, but its table and the training logs go to
# stdout).
export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
log() { echo "== [${SECONDS}s] $*" | tee -a "$out/$stage.log"; }  # seconds since the stage began
# the device tool brings back at most 8 files: there, everything but the log goes into one archive at the end
pack() {
  [[ -n ${OUT:-} && $(realpath "$out") == $(realpath "$OUT") ]] || return 0
  local files; mapfile -t files < <(cd "$out" && ls -A | grep -vx -e "$stage.log" -e "$stage-files.tar.gz")
  ((${#files[@]})) && tar -C "$out" -czf "$out/$stage-files.tar.gz" "${files[@]}" && (cd "$out" && rm -rf -- "${files[@]}")
  return 0
}
trap pack EXIT
# seconds a command may run before LIMIT stops it; 0: no limit, or none left
time_left() { ((limit)) && echo $((limit - SECONDS)) || echo 0; }
# true (and logged as skipped) when DEADLINE or LIMIT has passed for the command "$*"
past_time() {
  if ((deadline && SECONDS >= deadline)); then log "skipped, past DEADLINE=${deadline}s: $*"; return 0; fi
  if ((limit && SECONDS >= limit)); then log "skipped, past LIMIT=${limit}s: $*"; return 0; fi
  return 1
}
run() {
  past_time "$@" && return 0
  local left; left=$(time_left)
  log "$*"
  if ((limit)); then timeout -k 10 "$left" "$@" 2>&1 | tee -a "$out/$stage.log"
  else "$@" 2>&1 | tee -a "$out/$stage.log"; fi
  local rc=${PIPESTATUS[0]}
  if ((limit && rc == 124)); then log "exit status 124: stopped at LIMIT=${limit}s"
  elif ((rc > 128)); then log "exit status $rc: killed by SIG$(kill -l $((rc - 128)))"
  elif ((rc != 0)); then log "exit status $rc"; fi
  ((rc == 0)) || failed=1
  return $rc
}
# the rows that decide the targets: bf16 against fp32 at the Multi30k shape, eager and with each batch shape's whole
# update recorded; Transformer-base with recorded updates, on Multi30k's sentences, then at the lengths of news
# corpora (WMT, about 30 tokens a sentence: Multi30k's pairs joined two by two), which Transformer-base's users
# train on and where its attention calls are less short
target_rows() {
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config --precisions fp32,bf16 \
      --compile off --update-graphs off,on --steps $steps --profile 10 --json "$out/updates.json" ${TRAIN_ARGS:-}
    # the same recorded rows with sentences side by side in attention rows of 128 positions: bf16 gained 5% from it
    # (987,478 against 936,560, 2026-11-27) where it stands at 1.29x fp32 and the target is 1.3x; fp32's gain was
    # never measured, and together the two rows say whether packing by default on CUDA would meet the ratio
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config --precisions fp32,bf16 \
      --compile off --update-graphs on --steps $steps --set model.transformer.attention_pack=128 \
      --json "$out/updates_packed_config.json" ${TRAIN_ARGS:-}
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile off --update-graphs on --steps $steps --profile 5 --json "$out/updates_base.json" ${TRAIN_ARGS:-}
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile off --update-graphs on --steps $steps --join 2 --json "$out/updates_base_join2.json" ${TRAIN_ARGS:-}
}
# CONFIG STEPS: trains CONFIG for STEPS updates in bf16, validating every 200, eagerly and with recorded updates side
# by side, and prints both runs' log lines: recorded RNN updates went wrong after a validation once (2026-11-27)
recorded_against_eager() {
  local i rc name=$(basename "$1" .yaml) ways=(false true) limited=() pids=()
  past_time recorded_against_eager "$@" && return 0
  ((limit)) && limited=(timeout -k 10 "$(time_left)")
  for i in 0 1; do
    log "$py -m nmt train $1 ... --set train.cuda_graphs=${ways[i]} > $out/${name}_graphs_${ways[i]}.log (in the background)"
    "${limited[@]}" "$py" -m nmt train "$1" --restart --set run_dir=/tmp/gpu_${name}_graphs_${ways[i]} \
      --set train.device=$device --set train.precision=bf16 --set train.cuda_graphs=${ways[i]} \
      --set train.max_steps=$2 --set train.valid_every=200 --set train.log_every=50 ${TRAIN_ARGS:-} \
      > "$out/${name}_graphs_${ways[i]}.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do
    wait "${pids[i]}"; rc=$?
    log "train.cuda_graphs=${ways[i]}: exit status $rc"; ((rc == 0)) || failed=1
    grep -iE "step [0-9]+|error|traceback" "$out/${name}_graphs_${ways[i]}.log" | tee -a "$out/$stage.log"
  done
}
# CONFIG RUN_DIR METRICS: trains 150 updates with recorded updates, validating and saving, resumes to 200, and
# copies the run's metrics.jsonl to METRICS
recorded_and_resumed() {
  local steps_to
  for steps_to in 150 200; do
    run "$py" -m nmt train "$1" --set run_dir="$2" --set train.device=$device --set train.cuda_graphs=true \
      --set train.max_steps=$steps_to --set train.valid_every=100 ${TRAIN_ARGS:-}
  done
  cp "$2/metrics.jsonl" "$3" 2>/dev/null
}

case $stage in
  speed)
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config,base \
      --precisions fp32,bf16,bf16-autocast --compile off --steps $steps --profile 10 --json "$out/speed.json" ${TRAIN_ARGS:-}
    # lengths not rounded up to 8: whether padding still helps the small model once every shape has been seen;
    # then in relative steps (train.length_buckets: relative), fewer shapes than unrounded, less padding than 8
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --precisions fp32,bf16 --compile off \
      --steps $steps --set train.pad_to_multiple=1 --json "$out/speed_multiple1.json" ${TRAIN_ARGS:-}
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --precisions fp32,bf16 --compile off \
      --steps $steps --set train.length_buckets=relative --json "$out/speed_relative.json" ${TRAIN_ARGS:-}
    # the same with pairs sorted by both lengths (train.batch_order: lengths): what its padding (93.4% of the target
    # positions real against 90.3% at 4,096 tokens) gains on a GPU, against the per-update learning it costs
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --precisions fp32,bf16 --compile off \
      --steps $steps --set train.length_buckets=relative --set train.batch_order=lengths \
      --json "$out/speed_relative_lengths.json" ${TRAIN_ARGS:-}
    # the host's time in the bf16 copy's bookkeeping, which every bf16 update adds
    run "$py" bench/half_copy_speed.py configs/multi30k_transformer.yaml --device "$device" ;;
  compiled)
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config,base \
      --precisions fp32,bf16 --compile on --steps $steps --json "$out/compiled.json" ${TRAIN_ARGS:-}
    # an RNN compiles its decoder step (one graph for every target length): whether that pays on a GPU
    run "$py" bench/train_speed.py configs/multi30k_rnn_bahdanau.yaml --precisions fp32,bf16 --compile off,on \
      --steps 20 --json "$out/compiled_rnn.json" ${TRAIN_ARGS:-} ;;
  graphs)
    # the acceptance rows first, each call writing its JSON, so that a stage cut short still leaves them
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config --precisions fp32,bf16 \
      --compile reduce-overhead --steps $steps --profile 10 --json "$out/graphs.json" ${TRAIN_ARGS:-}
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile reduce-overhead --steps $steps --profile 5 --json "$out/graphs_base.json" ${TRAIN_ARGS:-}
    # attention as plain matrix products and softmax, which the compiler fuses: Transformer-base's flash and
    # memory-efficient attention kernels took more GPU time than its largest matrix products on these short
    # sentences (H200, 2026-11-26)
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile reduce-overhead --attention math --steps $steps --json "$out/graphs_base_math.json" ${TRAIN_ARGS:-}
    # cuDNN's attention, which training leaves out because it plans every new shape: static shapes plan a few
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile reduce-overhead --attention cudnn,flash,efficient,math --steps $steps \
      --json "$out/graphs_base_cudnn.json" ${TRAIN_ARGS:-}
    # lengths unrounded: a graph per distinct length, but no padding on Multi30k's short sentences
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config --precisions bf16 \
      --compile reduce-overhead --steps $steps --set train.pad_to_multiple=1 --json "$out/graphs_multiple1.json" \
      ${TRAIN_ARGS:-} ;;
  first)
    # a session of 15 device minutes: the rows that decide the targets and the GPU tests of the newest code, in
    # one call (run it with DEADLINE, which leaves out what the call has no time for)
    target_rows
    # every test that needs CUDA (the RNN encoder's and decoders' fused calls, recorded updates, kernels, loss)
    run "$py" -m pytest -q -rs -m gpu tests
    # the no-attention RNN (its first validation broke recorded updates with cuDNN's kernels), eager and recorded
    recorded_against_eager configs/multi30k_rnn_noattn.yaml 700
    # the RNN encoder packed and unpacked, then the three RNN experiments' updates eager and recorded
    for e in multi30k_rnn_bahdanau multi30k_rnn_luong_general; do
      run "$py" bench/rnn_encoder_speed.py configs/$e.yaml --device $device
    done
    for e in multi30k_rnn_bahdanau multi30k_rnn_luong_general multi30k_rnn_noattn; do
      run "$py" bench/train_speed.py configs/$e.yaml --precisions fp32,bf16 --compile off --update-graphs off,on \
        --steps 20 --json "$out/updates_$e.json" ${TRAIN_ARGS:-}
    done
    # fp16 (GPUs without bf16) under autocast and on an fp16 copy (train.half_weights: true), and bf16 under
    # autocast, eager and recorded (the gradient scaler recorded with the update), which train.cuda_graphs true
    # allows since 2026-11-27 and auto leaves eager until timed here
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config \
      --precisions fp16,fp16-copy,bf16-autocast --compile off --update-graphs off,on --steps $steps \
      --json "$out/updates_fp16.json" ${TRAIN_ARGS:-}
    # sentences side by side in attention rows of 128 positions (attention_pack) gained 22% on Transformer-base at
    # Multi30k's lengths (2026-11-27); at news corpora's (--join 2: 530,918 unpacked that day) they sit two or three
    # to a row and lose the causal kernels' skipped tiles: whether packing can be CUDA's default there too
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile off --update-graphs on --steps $steps --join 2 --set model.transformer.attention_pack=128 \
      --json "$out/updates_base_join2_packed.json" ${TRAIN_ARGS:-} ;;
  updates)
    # first what decides the targets, should the call run out of time
    target_rows
    # Transformer-base again with sentences side by side in each attention call's rows of up to 128 positions
    # (model.transformer.attention_pack; the Multi30k shape's rows are in target_rows): what the attention
    # bench's rows kernel (below) gains in a whole update
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile off --update-graphs on --steps $steps --set model.transformer.attention_pack=128 \
      --json "$out/updates_packed.json" ${TRAIN_ARGS:-}
    # flash against the memory-efficient kernel at longer sentences than Multi30k's, at Transformer-base's batches:
    # the latter, which training tries first, was faster from 16 to 64 positions and even at 128 (H200, 2026-11-27);
    # and what attention over batches packed without their padding would cost: sentence by sentence (varlen),
    # or laid into rows of 128 positions with a block-diagonal bias (packed), whose tiles a fused kernel fills;
    # and the padded batch side by side in such rows, as model.transformer.attention_pack does it (rows)
    run "$py" bench/attention_speed.py --device "$device" --lengths 16,24,32,64,128,256,512 \
      --kernels flash,efficient,varlen,packed,rows --json "$out/attention_varlen.json"
    # the bf16 rows with torch's order, flash before the memory-efficient kernel (training's is the other way
    # round, nmt.kernels.ATTENTION_KERNELS): what the decoder's causal self-attention gains from it
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config,base --precisions bf16 \
      --compile off --update-graphs on --attention flash,efficient,math --steps $steps \
      --json "$out/updates_flash_first.json" ${TRAIN_ARGS:-}
    # the same update graphs over the coarser buckets a compiled model keeps (lengths a multiple of 8): what the
    # relative ones (train.length_buckets auto, above) gain by padding less (bench/batch_shapes.py)
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config --precisions fp32,bf16 \
      --compile off --update-graphs on --steps $steps --set train.length_buckets=multiple \
      --json "$out/updates_multiple.json" ${TRAIN_ARGS:-}
    # the gradients that are column sums (Linear biases, LayerNorm weights and biases), each way, at the
    # Multi30k shape's and Transformer-base's widths: autograd's bias sums took 9% of a recorded bf16 update
    run "$py" bench/reduction_speed.py --device "$device" --json "$out/reduction.json"
    run "$py" bench/reduction_speed.py --device "$device" --shape base --json "$out/reduction_base.json"
    # bf16 logits read by the softmax kernels themselves (where this torch's do); training's attention order
    run "$py" -c "import torch, nmt.train.loss as l; x = torch.randn(4, 8, device='$device', dtype=torch.bfloat16)
l._softmax_in(torch.float32, x, log=True); print('softmax kernels read bf16 themselves:', l._READS_HALF.get(torch.bfloat16, x.is_cuda))"
    run "$py" -m pytest -q -rs tests/train/test_loss.py tests/test_runtime.py tests/test_kernels.py tests/models/test_multihead.py tests/models/test_transformer.py \
      tests/test_distributed.py::test_on_cuda_neither_waits_for_the_work_queued_after_its_values
    run "$py" -m pytest -q -rs tests/train/test_graphs.py || exit 1  # the toy trainings need them
    recorded_and_resumed configs/toy_transformer.yaml /tmp/gpu_updates "$out/updates_metrics.jsonl"
    # two batches an update: each batch shape's part recorded apart, the update's end once
    run "$py" -m nmt train configs/toy_transformer.yaml --set run_dir=/tmp/gpu_updates_accumulate \
      --set train.device=$device --set train.cuda_graphs=true --set train.accumulate=2 --set train.max_steps=100 \
      --set train.valid_every=50 --restart ${TRAIN_ARGS:-}
    cp /tmp/gpu_updates_accumulate/metrics.jsonl "$out/updates_accumulate_metrics.jsonl" 2>/dev/null ;;
  rnn-updates)
    # the RNN experiments' updates, eager and recorded whole (train.cuda_graphs): on an H200 the eager Bahdanau
    # RNN trained at 98,689 target tokens/s in fp32 (its encoder then packed by lengths read on the host), bound
    # by the launches of its decoder's steps, and in 240 s side by side the RNNs did not converge (2026-11-27)
    # first the encoder alone: packed by lengths read on the host (the host waits), or over the padded source
    # (CUDA's way since 2026-11-27: a cuDNN call a layer and direction, an LSTM's final cell states rebuilt)
    for e in multi30k_rnn_bahdanau multi30k_rnn_luong_general; do
      run "$py" bench/rnn_encoder_speed.py configs/$e.yaml --device $device
    done
    run "$py" -m pytest -q -rs tests/models/test_rnn.py -k "what_packing_gives and cuda" || exit 1
    for e in multi30k_rnn_bahdanau multi30k_rnn_luong_general; do
      run "$py" bench/train_speed.py configs/$e.yaml --precisions fp32,bf16 --compile off --update-graphs off,on \
        --steps 20 --profile 5 --json "$out/updates_$e.json" ${TRAIN_ARGS:-}
    done
    run "$py" -m pytest -q -rs tests/train/test_graphs.py -k "(recurrent and not cpu) or packs or rnn" || exit 1
    recorded_and_resumed configs/toy_rnn_luong_general.yaml /tmp/gpu_rnn_updates "$out/rnn_updates_metrics.jsonl"
    # last, as it compiles: recorded updates over a compiled decoder step (its attention, cell and readout fused),
    # one graph with symbolic sizes for every batch shape
    run "$py" bench/train_speed.py configs/multi30k_rnn_bahdanau.yaml --precisions bf16 --compile default \
      --update-graphs on --steps 20 --set train.compile_dynamic=true --json "$out/updates_rnn_compiled.json" \
      ${TRAIN_ARGS:-} ;;
  updates-compiled)
    # update graphs of a compiled model (default mode: kernels fused, no graphs of its own), a compilation per
    # batch shape (so lengths a multiple of 8): the Multi30k shape in fp32 and bf16, then Transformer-base
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes config --precisions fp32,bf16 \
      --compile default --update-graphs on --steps $steps --profile 10 --json "$out/updates_compiled.json" \
      ${TRAIN_ARGS:-}
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile default --update-graphs on --steps $steps --profile 5 --json "$out/updates_compiled_base.json" \
      ${TRAIN_ARGS:-}
    # attention as plain matrix products and a softmax the compiler fuses with its scaling and mask
    run "$py" bench/train_speed.py configs/multi30k_transformer.yaml --shapes base --precisions bf16 \
      --compile default --update-graphs on --attention math --steps $steps \
      --json "$out/updates_compiled_base_math.json" ${TRAIN_ARGS:-} ;;
  multi30k)
    run_dir=/tmp/gpu_multi30k_transformer
    run "$py" -m nmt experiment configs/multi30k_transformer.yaml --restart --results "$out" \
      --set run_dir=$run_dir --set train.device=$device --set train.precision=bf16 --set train.max_time=$seconds \
      ${TRAIN_ARGS:-}
    cp "$run_dir/metrics.jsonl" "$out/" 2>/dev/null
    ckpt=$("$py" -c "import json, sys; print(json.load(open(sys.argv[1]))['checkpoint'])" \
      "$out/multi30k_transformer.json") || { log "no results JSON: training failed"; exit 1; }
    decode=(bench/decode_speed.py "$ckpt" "$data/test_2016_flickr.de.gz" --ref "$data/test_2016_flickr.en.gz"
            --only beam --cached-only)
    run "$py" "${decode[@]}" --device cpu --outputs "$out/cpu" --json "$out/decode_cpu.json"
    run "$py" "${decode[@]}" --device "$device" --precision fp32,bf16 --repeat 3 --against "$out/cpu" \
      --outputs "$out/cuda" --json "$out/decode_cuda.json" --profile
    # a file of 20,000 lines, read in chunks as nmt translate reads it: chunks sized by the batch budget,
    # then the 2,000 lines of every chunk before (one full batch and one small one each)
    run "$py" "${decode[@]}" --device "$device" --copies 20 --json "$out/decode_file.json"
    run "$py" "${decode[@]}" --device "$device" --copies 20 --chunk-lines 2000 --json "$out/decode_file_2000.json" ;;
  experiments)
    # every experiment at once, each its own process on the one GPU, with an equal share of the CPU cores: a
    # Multi30k model leaves the GPU idle for much of its step (bound by its host, H200 profiles of 2026-11-26),
    # so runs side by side should share it well (unmeasured yet: each result records its tokens/s), and six
    # fit one call of the device's 10 minutes, where one after another they got 60 s of training each
    names=(${EXPERIMENTS:-multi30k_transformer multi30k_transformer_dropout01 multi30k_transformer_en_de \
           multi30k_rnn_bahdanau multi30k_rnn_luong_general multi30k_rnn_noattn})
    threads=$(( $(nproc) / ${#names[@]} )); ((threads > 0)) || threads=1
    pids=()
    for e in "${names[@]}"; do
      cmd=("$py" -m nmt experiment "configs/$e.yaml" --restart --results "$out" --set run_dir=/tmp/gpu_$e
           --set train.device=$device --set train.max_time=${TRAIN_SECONDS:-480} --set train.valid_every=500 ${TRAIN_ARGS:-})
      log "OMP_NUM_THREADS=$threads ${cmd[*]} > $out/$e.log (in the background)"
      ((limit)) && cmd=(timeout -k 10 "$(time_left)" "${cmd[@]}")
      OMP_NUM_THREADS=$threads "${cmd[@]}" > "$out/$e.log" 2>&1 &
      pids+=($!)
    done
    failed=0
    for i in "${!names[@]}"; do
      wait "${pids[i]}"; rc=$?
      ((rc == 0)) || { log "${names[i]}: exit status $rc (the end of $out/${names[i]}.log follows)"
                       tail -n 30 "$out/${names[i]}.log" | tee -a "$out/$stage.log"; failed=1; }
      cp "/tmp/gpu_${names[i]}/metrics.jsonl" "$out/${names[i]}.metrics.jsonl" 2>/dev/null
    done
    "$py" -c 'import sys; from nmt.results import load_results, results_table
print(results_table(load_results(sys.argv[1])))' "$out" | tee -a "$out/$stage.log"
    exit $failed ;;
  tests)
    run "$py" -m pytest -q -rs tests/test_distributed.py tests/test_runtime.py tests/test_kernels.py tests/test_translate.py \
      tests/train/test_half.py tests/train/test_step.py tests/train/test_graphs.py tests/train/test_loss.py
    run "$py" -m nmt train configs/toy_transformer.yaml --restart --set run_dir=/tmp/gpu_cuda0 \
      --set train.device=$device:0 --set train.max_steps=100 --set train.valid_every=100
    run "$py" -m nmt train configs/toy_rnn_bahdanau.yaml --restart --set run_dir=/tmp/gpu_rnn_bf16 \
      --set train.device=$device --set train.precision=bf16 --set train.max_steps=100 --set train.valid_every=100
    # what a validation's save costs the loop with the state on the GPU: written in its thread, or in the background
    run "$py" bench/checkpoint_speed.py configs/multi30k_transformer.yaml --device "$device" ;;
  *)
    echo "bench/gpu_acceptance.sh: unknown stage '$stage'; use first, speed, compiled, graphs, updates, rnn-updates, updates-compiled, multi30k, experiments or tests" >&2
    exit 2 ;;
esac
exit $failed
