#!/usr/bin/env bash
# One single-GPU lease (nvidia-h200) for the Qwen2.5-Coder-1.5B-Instruct target and SmolLM2-135M-Instruct, after
# staging both GGUFs (gguf-models stage ...: Qwen in .stage, SmolLM2 with --repo .s135 --chunk-mib 40, as the tool
# sizes .s135's chunks without the work tree that travels with them):
#   bash benchmarks/lease_h200.sh preflight .init .evaldata .prose  # here, first: the launch call's size vs the tool's limit
#   bash benchmarks/lease_h200.sh launch     # copy the work tree to ~/lease/repo, start the pipeline detached (setsid)
#   bash benchmarks/lease_h200.sh sync       # copy this call's src/ trainers/ kernels/ benchmarks/ over ~/lease/repo:
#                                            # phases not yet started run the patched code (a fix found mid-lease)
#   bash benchmarks/lease_h200.sh wait SECS  # hold the machine up to SECS (or until DONE), pack ~/lease/out into
#                                            # $OUT/lease.tgz (drafts in $OUT/drafts.tgz)
# The machine is held only while a command runs on it: issue the wait calls back to back (it is released after
# ~30 s with none running, and the pipeline with it; session 14 lost a lease that way, session 20 another). Never put
# a wait in the same batch as the launch: a refused launch leaves nothing to wait for (wait then exits 3 at once).
# Pipeline (every phase logs to ~/lease/out/<phase>/, a failed phase does not stop the next; times on one H200):
#   profile  (GPU alone, beside data + convert) where a LongSpec step's and a training step's time go, on random
#            weights of the Qwen shape (kernel_profile.py unless PROFILE_CONTEXTS=none; train_profile.py unless
#            PROFILE_TRAIN=0)                                                                          ~2.5 min
#   data     (CPU, beside convert) the corpus scans of both mixed recipes, once per tokenizer (`longspec data`,
#            rows_cache): code of several languages + prose of the machine's packages and docs, long rows; and the
#            Qwen chat prompts (`longspec data --prompts`, chat_prompts_cache), which chat and train then read
#   convert  GGUFs -> ~/qwen15 (bf16) and ~/smollm2 (fp32)                                             ~2 min
#   chat     the Qwen target's own chat answers over short and long corpus documents (`longspec data --chat`) ~4 min;
#            CHAT_ROUNDS rounds of prompts (data.mix.chat_rounds), the answers of earlier leases read from $CHAT_KEPT
#            (`wait` brings the cache back as chat-answers-qwen15.jsonl.gz: commit it there, then CHAT_ROUNDS + 1);
#            CHAT_S=0: no generation, the kept answers alone
#   gputests (beside chat, after profile) CUDA graphs, compiled step, feature drafts, retrieval, draft vocabulary,
#            plain loop, 1,000-call long run
#   train    the Qwen draft (gpu_train_mix.sh: recipe $RECIPE + DRAFT_SET, TRAIN_MIN minutes of steps), continued
#            from the committed drafts/qwen2.5-coder-1.5b-instruct.int4.safetensors (INIT_DRAFT: another saved or
#            compact draft; empty: a new one), then its compact int8 copy, which the tau and bench phases load
#            and `wait` brings back in parts (commit it over the old one when its tau holds up)          ~9 min
#   smol     (SMOL=1 only, from the end of data, beside chat, train and tau) SmolLM2 drafts at equal budget, one lever changed each
#            (SMOL_VARIANTS, SMOL_STEPS steps or SMOL_MIN minutes), their tau in fp32 (tree / chain) beside the
#            bundled draft's, and the bundled draft's successor (SMOL_FINAL_MIN minutes; SMOL_FINAL=0: neither;
#            SMOL_INIT: the draft it continues, else a new one; SMOL_SET: its extra `longspec train` arguments;
#            SMOL_VARIANTS= : no levers); SMOL_MIX: JSON members
#            over the smollm2 recipe's data.mix, in the data phase's rows and in every SmolLM2 run
#   tau      the Qwen draft: tree + retrieval and chain (TAU_CONFIGS) on held-out + public documents, 2 per bucket
#            (TAU_BUCKETS, default 8192,16384,30000; TAU_DATASETS: the sets, in the order they run); beside it
#            (TAU4_S > 0) tau4: its int4 copy, tree + retrieval;
#            and (ACCEPT_S, default 240; 0: none) accept: the new draft, its int4 copy and INIT_DRAFT teacher-forced on
#            the same fixed target texts (accept_matrix.py: per-level acceptance, replayed chain τ, no near-tie noise)
#   bench    every greedy method end to end in one process, alone on the GPU (BENCH_S=0: none; BENCH_METHODS,
#            BENCH_DATASETS, BENCH_BUCKETS). PIPELINE=pipeline-bench: convert and this bench of INIT_DRAFT alone
# PIPELINE=pipeline-levers: data, convert, the kept chat answers, then qwen-levers: new Qwen drafts at equal steps
#   (QWEN_STEPS), one lever changed each (QWEN_VARIANTS: base nochat nolong nosoft noinit python), QWEN_LANES at a
#   time, all teacher-forced beside INIT_DRAFT on the fixed texts of QWEN_ANSWERS (accept_levers.json)
# Set LONGSPEC_COMMIT on the launch command line; carry .evaldata (public jsonl + heldout.jsonl).
# DRY=1: the same pipeline on a CPU in minutes (tiny data and steps, 2k-token prompts, 16 new tokens; HOME pointing at
# a folder with stage/qwen2.5-coder-1.5b-instruct.gguf and stage/smollm2-135m-instruct.gguf, any small GGUFs).
set -uo pipefail
L=$HOME/lease
DRY=${DRY:-0}
QWEN_GGUF=$HOME/stage/qwen2.5-coder-1.5b-instruct.gguf
SMOL_GGUF=$HOME/stage/smollm2-135m-instruct.gguf
RECIPE=${RECIPE:-qwen2.5-coder-1.5b-mix}
SMOL_RECIPE=${SMOL_RECIPE:-smollm2-mix}
DRAFT_SET=${DRAFT_SET:-'{}'}  # over the recipe's draft section
QWEN_MIX=${QWEN_MIX:-'"short_rows": 24000'}  # over the recipe's data.mix (non-empty: JSON members)
# earlier leases' answers (committed); CHAT_KEPT= : none (a from-scratch run makes all of its own)
CHAT_KEPT=${CHAT_KEPT-drafts/chat-answers-qwen2.5-coder-1.5b-instruct.jsonl.gz}
# the "prose" kind's shares (SmolLM2 variant `prose`; for the Qwen run put them and "prose_roots" in QWEN_MIX), read
# from .prose (benchmarks/build_prose.py, carried with the launch)
PROSE_MIX=${PROSE_MIX:-'"kinds": {"python": 0.35, "c_cpp": 0.25, "other_code": 0.05, "docs": 0.2, "prose": 0.15}, "long_kinds": {"python": 0.35, "c_cpp": 0.35, "docs": 0.1, "prose": 0.2}, "chat_kinds": ["python", "c_cpp", "docs", "prose"]'}

phase() {  # phase NAME SECONDS COMMAND...: run COMMAND (killed after SECONDS) with OUT=$L/out/NAME, log the outcome
  local name=$1 limit=$2
  shift 2
  mkdir -p "$L/out/$name"
  echo "$(date +%T) start $name" >> "$L/status"
  (cd "$L/repo" && OUT=$L/out/$name timeout "$limit" "$@") > "$L/out/$name/phase.log" 2>&1
  local rc=$?  # 124: killed at the limit (timeout signals the phase's whole process group)
  echo "$(date +%T) end $name rc=$rc" >> "$L/status"
}

pkg() {  # pkg DIR: the package assembled under DIR, on PYTHONPATH with the staged gguf reader
  bash benchmarks/assemble_package.sh "$1" && export PYTHONPATH=$1:$HOME/stage/site PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1 LONGSPEC_EVAL_DIR=$PWD/.evaldata
}

init_draft() {  # the draft training starts from: INIT_DRAFT, else the committed int4 file (INIT_DRAFT= : a new one)
  echo "${INIT_DRAFT-$L/repo/drafts/qwen2.5-coder-1.5b-instruct.int4.safetensors}"
}

dry() {  # dry SMALL LARGE: SMALL in a dry run, else LARGE
  if [ "$DRY" = 1 ]; then echo "$1"; else echo "$2"; fi
}

# data.mix settings of every Qwen run: the corpus rows, chat prompts and chat answers the data and chat phases made
qwen_mix() {
  echo "{\"rows_cache\": \"$HOME/rows-qwen15.pt\", \"chat_prompts_cache\": \"$HOME/prompts-qwen15.pt\", \
\"chat_cache\": \"$HOME/chat-cache-qwen15.jsonl\", \"chat_rounds\": ${CHAT_ROUNDS:-1}, $QWEN_MIX$(dry \
    ', "short_rows": 48, "short_seq_length": 256, "short_rows_per_step": 4, "long_rows": 2, "long_seq_length": 2048, "long_min_length": 1024, "chat_prompts": 4, "chat_prompt_chars": [800, 1600], "chat_long_prompts": 2, "chat_long_prompt_chars": [1600, 3200], "chat_max_new_tokens": 16, "chat_batch_size": 4' '')${1:-}}"
}
smol_mix() {
  echo "{\"rows_cache\": \"$HOME/rows-smollm2.pt\", \"chat_cache\": \"$HOME/chat-cache-smollm2.jsonl\"${SMOL_MIX:+, $SMOL_MIX}$(dry \
    ', "short_rows": 48, "short_seq_length": 256, "short_rows_per_step": 4, "long_rows": 2, "long_seq_length": 2048, "long_min_length": 1024, "chat_prompts": 4, "chat_prompt_chars": [800, 1600], "chat_long_prompts": 2, "chat_long_prompt_chars": [1600, 3200], "chat_max_new_tokens": 16, "chat_batch_size": 4' '')${1:-}}"
}
json_with() {  # json_with OBJECT MEMBERS: the JSON object OBJECT with the members of the JSON object MEMBERS over it
  python3 -c 'import json, sys
print(json.dumps({**json.loads(sys.argv[1]), **json.loads(sys.argv[2])}))' "$1" "$2"
}
set_mix() {  # set_mix JSON: the --set-mix arguments of a JSON object, one per line (compact JSON: no spaces)
  python3 -c 'import json, sys
for k, v in json.loads(sys.argv[1]).items():
    print("--set-mix=" + k + "=" + json.dumps(v, separators=(",", ":")))' "$1"
}

case "${1:-}" in
  launch)
    rm -rf "$L" && mkdir -p "$L/out" "$L/repo"
    tar --exclude=./.stage --exclude=./.s135 --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C "$L/repo"
    setsid nohup bash "$L/repo/benchmarks/lease_h200.sh" "${PIPELINE:-pipeline}" > "$L/pipeline.log" 2>&1 < /dev/null &
    sleep 2 && cat "$L/status" 2>/dev/null; echo launched ;;
  pipeline)  # phase limits keep the whole lease inside its device time
    export LONGSPEC_COMMIT=${LONGSPEC_COMMIT:-unknown} DRY
    draft=$HOME/draft-qwen15
    phase data "$(dry 300 420)" bash benchmarks/lease_h200.sh data &
    data_pid=$!
    (phase profile "${PROFILE_S:-$(dry 60 200)}" bash benchmarks/lease_h200.sh profile
     phase gputests "${TESTS_S:-420}" bash benchmarks/lease_h200.sh gputests) &
    tests_pid=$!
    phase convert 300 bash -c 'bash benchmarks/lease_h200.sh convert'
    wait "$data_pid"  # the chat prompts the chat phase answers
    # the limit leaves the model load and one long-document batch past the generation budget (at + 90 s the long
    # answers of session 13 were lost)
    phase chat "$(dry 240 $(( ${CHAT_S:-240} + 150 )))" bash benchmarks/lease_h200.sh chat &
    chat_pid=$!
    # SmolLM2 from the end of the data phase (beside chat, train and tau) for at most SMOL_S seconds (a variant not
    # done by then is left out): the bench runs alone
    smol_pid=
    if [ "${SMOL:-0}" = 1 ] && [ -f "$HOME/smollm2/config.json" ]; then
      phase smol "${SMOL_S:-$(dry 900 690)}" bash benchmarks/lease_h200.sh smol &
      smol_pid=$!
    fi
    wait "$chat_pid"
    # the limit covers TRAIN_MIN minutes of steps plus the data build (117 s in session 21), the final evaluation, the
    # save and the compact copies: at + 150 s session 21's run was killed after its last step, before the save
    phase train "$(( ${TRAIN_MIN:-7} * 60 + 330 ))" bash benchmarks/lease_h200.sh train
    wait "$tests_pid"
    if [ ! -f "$draft/config.json" ]; then  # no trained draft (training failed or ran out of time): measure the draft
      # training started from (the train phase's INIT_DRAFT), said in the status file (session 21 measured an untrained
      # draft unawares)
      draft=$(init_draft)
      [ "$DRY" = 0 ] && [ -f "$draft" ] || draft=
      echo "$(date +%T) NO TRAINED DRAFT: tau and bench measure ${draft:-an untrained draft}" >> "$L/status"
    fi
    [ -z "$draft" ] || [ ! -f "$draft.int8.safetensors" ] || draft=$draft.int8.safetensors  # measure what is kept
    # the trained draft beside the one training started from, on the same fixed texts (not a timing either)
    accept_pid=
    if [ "${ACCEPT_S:-240}" != 0 ]; then
      phase accept "$(( ${ACCEPT_S:-240} + 120 ))" bash benchmarks/lease_h200.sh accept "$draft" &
      accept_pid=$!
    fi
    # the int4 copy's tau beside the int8 one's (tau is not a timing: the two may share the GPU)
    tau4_pid=
    if [ "${TAU4_S:-0}" != 0 ] && [ -f "$HOME/draft-qwen15.int4.safetensors" ]; then
      TAU_CONFIGS=tree+retrieval TAU_S=$TAU4_S phase tau4 "$(( TAU4_S + 90 ))" bash benchmarks/lease_h200.sh tau \
        "$HOME/draft-qwen15.int4.safetensors" &
      tau4_pid=$!
    fi
    [ "${TAU_S:-160}" = 0 ] || phase tau "$(( ${TAU_S:-160} + 90 ))" bash benchmarks/lease_h200.sh tau "$draft"
    [ -z "$tau4_pid" ] || wait "$tau4_pid"
    [ -z "$accept_pid" ] || wait "$accept_pid"
    [ -z "$smol_pid" ] || wait "$smol_pid"
    [ "${BENCH_S:-180}" = 0 ] || phase bench "$(( ${BENCH_S:-180} + 100 ))" bash benchmarks/lease_h200.sh bench "$draft"
    echo "$(date +%T) DONE" >> "$L/status" ;;
  pipeline-bench)  # a lease too short to train: the tau (TAU_S > 0) and the bench of INIT_DRAFT (session 22: 13
                   # device-minutes left)
    export LONGSPEC_COMMIT=${LONGSPEC_COMMIT:-unknown} DRY
    phase convert 300 bash benchmarks/lease_h200.sh convert
    [ "${TAU_S:-0}" = 0 ] || phase tau "$(( TAU_S + 90 ))" bash benchmarks/lease_h200.sh tau "$INIT_DRAFT"
    phase bench "$(( ${BENCH_S:-180} + 100 ))" bash benchmarks/lease_h200.sh bench "$INIT_DRAFT"
    echo "$(date +%T) DONE" >> "$L/status" ;;
  pipeline-smol)  # SmolLM2 alone (a lease too short for staging the Qwen target): GPU tests, drafts, bench
                  # (TESTS_S: the GPU tests' limit; BENCH_SMOL=0: no bench; SMOL_BUNDLED_TAU=0: no tau of the bundled draft)
    export LONGSPEC_COMMIT=${LONGSPEC_COMMIT:-unknown} DRY
    phase gputests "${TESTS_S:-300}" bash benchmarks/lease_h200.sh gputests &
    tests_pid=$!
    phase data-smol 300 bash benchmarks/lease_h200.sh data-smol &
    data_pid=$!
    phase convert-smol 300 bash benchmarks/lease_h200.sh convert-smol
    wait "$data_pid"
    phase smol "${SMOL_S:-420}" bash benchmarks/lease_h200.sh smol
    wait "$tests_pid"
    [ "${BENCH_SMOL:-1}" = 0 ] || phase bench-smol 240 bash benchmarks/lease_h200.sh bench-smol
    echo "$(date +%T) DONE" >> "$L/status" ;;
  pipeline-levers)  # issue 12's ablation at Qwen scale: data, convert, the kept chat answers (CHAT_S=0), then qwen-levers
    export LONGSPEC_COMMIT=${LONGSPEC_COMMIT:-unknown} DRY
    phase data "$(dry 300 420)" bash benchmarks/lease_h200.sh data &
    data_pid=$!
    phase convert 300 bash benchmarks/lease_h200.sh convert
    wait "$data_pid"
    phase chat 120 bash benchmarks/lease_h200.sh chat
    phase levers "${LEVERS_S:-$(dry 900 960)}" bash benchmarks/lease_h200.sh qwen-levers
    echo "$(date +%T) DONE" >> "$L/status" ;;
  data-smol)
    pkg /tmp/pkg-data
    # shellcheck disable=SC2046
    python3 -m transformers_longspec.cli data --recipe "$SMOL_RECIPE" --target "$SMOL_GGUF" $(set_mix "$(smol_mix)") ;;
  convert-smol)
    pkg /tmp/pkg-convert
    python3 benchmarks/gguf_to_hf.py "$SMOL_GGUF" "$HOME/smollm2" --dtype float32 ;;
  bench-smol)  # every greedy method on SmolLM2 with the new bundled-draft candidate, 2k / 4k prompts, bf16
    pkg /tmp/pkg-bench-smol
    python3 -m transformers_longspec.cli bench --target "$HOME/smollm2" --draft "$HOME/draft-smol-final" --dtype bf16 \
      --methods plain_graph,longspec,longspec_noretr,retrieval_only,engine_plain \
      --variant 'longspec_noretr=longspec:{"longspec_beam_widths": [4, 16, 16, 16, 16], "longspec_retrieval": 0}' \
      --variant 'retrieval_only=longspec:{"longspec_beam_widths": [], "longspec_retrieval": 10}' \
      --variant 'engine_plain=longspec:{"longspec_beam_widths": [], "longspec_retrieval": 0}' \
      --datasets heldout,code_completion,summarization --buckets 2048,4096 --per-bucket 1 --max-new-tokens 256 \
      --max-seconds 150 --out "$OUT" 2>&1 | grep -v "it/s\]$" ;;
  data)  # both corpus scans at once (CPU only: they need just the tokenizers, read from the GGUFs)
    pkg /tmp/pkg-data
    # shellcheck disable=SC2046  # set_mix prints one argument per line
    python3 -m transformers_longspec.cli data --recipe "$RECIPE" --target "$QWEN_GGUF" $(set_mix "$(qwen_mix)") &
    # shellcheck disable=SC2046  # the Qwen chat prompts beside it, for chat and train (~200 s each in session 29)
    python3 -m transformers_longspec.cli data --prompts --recipe "$RECIPE" --target "$QWEN_GGUF" \
      $(set_mix "$(qwen_mix)") &
    [ ! -f "$SMOL_GGUF" ] || python3 -m transformers_longspec.cli data --recipe "$SMOL_RECIPE" --target "$SMOL_GGUF" \
      $(set_mix "$(smol_mix)")
    wait ;;
  convert)
    pkg /tmp/pkg-convert
    python3 benchmarks/gguf_to_hf.py "$QWEN_GGUF" "$HOME/qwen15" --dtype "$(dry float32 bfloat16)" &
    [ ! -f "$SMOL_GGUF" ] || python3 benchmarks/gguf_to_hf.py "$SMOL_GGUF" "$HOME/smollm2" --dtype float32
    wait
    mkdir -p "$HOME/stage" && ln -sfn "$HOME/qwen15" "$HOME/stage/qwen2.5-coder-1.5b-instruct" ;;
  gputests)
    if [ "$DRY" = 1 ]; then echo "dry run: no GPU tests"; else bash benchmarks/gpu_check.sh tests; fi ;;
  profile)  # where a training step's and a LongSpec step's time go (random weights of the Qwen shape)
    if [ "$DRY" = 1 ]; then echo "dry run: no GPU profile"; exit 0; fi
    pkg /tmp/pkg-profile
    # shellcheck disable=SC2086  # PROFILE_ARGS: more kernel_profile.py arguments, e.g. --intermediate-size 1536
    [ "${PROFILE_CONTEXTS:-}" = none ] || python3 benchmarks/kernel_profile.py \
      --contexts "${PROFILE_CONTEXTS:-8192,30000}" ${PROFILE_ARGS:-} --out "$OUT/kernel_profile.json"
    [ "${PROFILE_TRAIN:-1}" = 0 ] || python3 benchmarks/train_profile.py --out "$OUT/train_profile.json" ;;
  chat)  # the Qwen target's chat answers, cached for the train phase (which then generates none)
    pkg /tmp/pkg-chat
    [ -f "$HOME/chat-cache-qwen15.jsonl" ] || [ ! -f "$CHAT_KEPT" ] || \
      gunzip -c "$CHAT_KEPT" > "$HOME/chat-cache-qwen15.jsonl"
    [ "${CHAT_S:-240}" != 0 ] || exit 0  # CHAT_S=0: the kept answers alone (the GPU goes to training)
    # shellcheck disable=SC2046
    python3 -m transformers_longspec.cli data --chat --recipe "$RECIPE" --target "$HOME/qwen15" \
      $(set_mix "$(qwen_mix ", \"chat_time_budget_s\": $(dry 120 "${CHAT_S:-240}")")") ;;
  train)  # continues the committed compact draft unless INIT_DRAFT says otherwise (INIT_DRAFT= : a new draft);
          # TRAIN_SET: more `longspec train` arguments, e.g. "--set draft_vocab_loss=true"
    INIT_DRAFT=$(init_draft)
    [ -z "$INIT_DRAFT" ] || [ -f "$INIT_DRAFT" ] || INIT_DRAFT=
    [ "$DRY" = 0 ] || INIT_DRAFT=  # the dry run's target is a small stand-in: a new draft
    OUT=$OUT DRAFT=$HOME/draft-qwen15 TARGET=$HOME/qwen15 RECIPE=$RECIPE DRAFT_SET=$DRAFT_SET DRY_RUN=$DRY \
      MIX_SET="$(qwen_mix ', "chat_time_budget_s": 0')" CHAT_CACHE=$HOME/chat-cache-qwen15.jsonl PKG=/tmp/pkg-train \
      TRAIN_EXTRA="--max-steps $(dry 6 "${STEPS:-2000}") --max-minutes $(dry 1 "${TRAIN_MIN:-7}") ${INIT_DRAFT:+--draft $INIT_DRAFT} ${TRAIN_SET:-}" \
      bash benchmarks/gpu_train_mix.sh
    # the compact copies (one int8 file, `save_compact`: what the tau and bench phases load; one int4 file, whose
    # tau the tau4 phase measures): both come back
    pkg /tmp/pkg-train && python3 -c 'import sys, torch
from transformers_longspec import LongSpecDraft
draft = LongSpecDraft.from_pretrained(sys.argv[1], dtype=torch.float32)
print("compact draft:", draft.save_compact(sys.argv[2]), draft.save_compact(sys.argv[3], bits=4))' \
      "$HOME/draft-qwen15" "$HOME/draft-qwen15.int8.safetensors" "$HOME/draft-qwen15.int4.safetensors" ;;
  tau)  # the Qwen draft ($2; none: an untrained one) on held-out and public documents
    pkg "/tmp/pkg-$(basename "$OUT")"  # tau and tau4 run at once: a folder each
    python3 benchmarks/tau_matrix.py --target "$HOME/qwen15" ${2:+--draft "$2"} --dtype "$(dry float32 bfloat16)" \
      --configs "${TAU_CONFIGS:-tree+retrieval,chain}" \
      --datasets "${TAU_DATASETS:-heldout:4,code_completion,summarization}" --buckets "$(dry 2048 "${TAU_BUCKETS:-8192,16384,30000}")" --per-bucket \
      "$(dry 1 2)" --max-new-tokens "$(dry 16 256)" --max-seconds "$(dry 60 "${TAU_S:-160}")" --out "$OUT/tau_matrix.json" ;;
  accept)  # teacher-forced acceptance (accept_matrix.py) of the trained draft ($2) and its int4 copy beside the draft
           # training started from (INIT_DRAFT, as the train phase reads it), on the same fixed target texts
    pkg /tmp/pkg-accept
    init=$(init_draft)
    drafts=${2:+new=$2}
    [ ! -f "$HOME/draft-qwen15.int4.safetensors" ] || drafts="$drafts,new4=$HOME/draft-qwen15.int4.safetensors"
    [ "$DRY" = 1 ] || [ -z "$init" ] || [ ! -f "$init" ] || drafts="init=$init,$drafts"
    [ -n "${drafts#,}" ] || { echo "accept: no draft to measure"; exit 0; }
    python3 benchmarks/accept_matrix.py --target "$HOME/qwen15" --drafts "${drafts#,}" --dtype "$(dry float32 bfloat16)" \
      --datasets summarization,heldout:4,code_completion --buckets "$(dry 2048 "${TAU_BUCKETS:-8192,16384,30000}")" \
      --per-bucket "$(dry 1 2)" --max-new-tokens "$(dry 16 256)" --max-seconds "$(dry 60 "${ACCEPT_S:-240}")" \
      --out "$OUT/accept_matrix.json" ;;
  bench)  # every greedy method in one process (no other GPU work meanwhile); the held-out prose rows get a file of
          # their own (one prompt per bucket takes the first row of a file, a held-out code row in heldout.jsonl)
    grep '"dataset": "heldout-prose"' .evaldata/heldout.jsonl > .evaldata/heldout_prose.jsonl
    OUT=$OUT DRAFT=${2:-} NEW=$(dry 16 256) MAX_S=$(dry 60 "${BENCH_S:-180}") PKG=/tmp/pkg-bench DTYPE=$(dry fp32 bf16) \
      DATASETS="${BENCH_DATASETS:-heldout,heldout_prose,code_completion,summarization}" BUCKETS=$(dry 2048 "${BENCH_BUCKETS:-8192,16384,30000}") \
      METHODS=${BENCH_METHODS:-plain_graph,longspec,longspec_noretr,longspec_noretr_fullvocab,retrieval_only,engine_plain} \
      bash benchmarks/gpu_bench.sh greedy-retrieval ;;
  smol)  # SmolLM2 drafts from the same builder: the bundled draft's successor (`final`) in one lane, beside it the
         # levers at equal budget (SMOL_STEPS steps each, one lever changed), each followed by its tau
    pkg /tmp/pkg-smol
    if [ "${SMOL_FINAL:-1}" = 1 ]; then  # SMOL_FINAL=0: the levers alone
      bash benchmarks/lease_h200.sh smol-train final &  # the bundled draft's tau beside it (not a timing)
      [ "${SMOL_BUNDLED_TAU:-1}" = 0 ] || \
        bash benchmarks/lease_h200.sh smol-tau "$PWD/src/transformers_longspec/drafts/smollm2-135m-instruct" bundled
    fi
    for v in ${SMOL_VARIANTS-full nolayers nofeature nochat nolong nosoft noinit python nearfirst alloffsets prose}; do
      bash benchmarks/lease_h200.sh smol-train "$v"
    done
    wait ;;
  smol-train)  # smol-train VARIANT: one SmolLM2 draft into ~/draft-smol-VARIANT, then its tau
    draft_set=${SMOL_DRAFT_SET:-'{"target_hidden_input": true}'} mix_set="" extra="" steps=${SMOL_STEPS:-600} minutes=${SMOL_MIN:-2}
    case $2 in
      nofeature) draft_set='{"target_hidden_input": false, "target_feature_layers": null}' ;;
      nolayers) draft_set='{"target_hidden_input": true, "target_feature_layers": null}' ;;  # the final state only
      noinit) draft_set=$(json_with "$draft_set" '{"init_from_target": false}') ;;
      nochat) mix_set=', "chat_prompts": 0' ;;
      nolong) mix_set=', "long_rows": 0, "rows_cache": null' ;;  # the shared rows cache holds long rows
      nosoft) extra="--set soft_labels_topk=0" ;;
      nearfirst) extra="--set noise_weights=[0.4,0.3,0.2,0.1]" ;;  # more of the steps on the first draft levels
      alloffsets) extra="--set noise_offsets_per_step=4" ;;  # every tree level every step, one target pass
      prose) mix_set=", \"prose_roots\": [\"$PWD/.prose\"], \"rows_cache\": null, $PROSE_MIX" ;;  # general prose
      python) mix_set=', "kinds": {"python": 1.0}, "rows_cache": null' ;;  # the data mix: Python sources only
      final) steps=${SMOL_FINAL_STEPS:-2400} minutes=${SMOL_FINAL_MIN:-5} extra="${SMOL_INIT:+--draft $SMOL_INIT} ${SMOL_SET:-}" ;;
    esac
    OUT=$OUT/$2 DRAFT=$HOME/draft-smol-$2 RECIPE=$SMOL_RECIPE TARGET=$HOME/smollm2 PKG=/tmp/pkg-smol-$2 \
      CHAT_CACHE=$HOME/chat-cache-smollm2.jsonl DRAFT_SET="$draft_set" MIX_SET="$(smol_mix "$mix_set")" DRY_RUN=$DRY \
      TRAIN_EXTRA="$extra --max-steps $(dry 4 "$steps") --max-minutes $(dry 1 "$minutes")" \
      bash benchmarks/gpu_train_mix.sh && bash benchmarks/lease_h200.sh smol-tau "$HOME/draft-smol-$2" "$2" ;;
  smol-tau)  # smol-tau DRAFT_FOLDER NAME: tau of a SmolLM2 draft in fp32 (SMOL_TAU_CONFIGS), 2k and 4k prompts
    pkg "/tmp/pkg-smol-tau-$3"
    python3 benchmarks/tau_matrix.py --target "$HOME/smollm2" --draft "$2" --dtype float32 \
      --datasets heldout:4,code_completion,summarization --buckets 2048,4096 --per-bucket "${SMOL_TAU_PER_BUCKET:-1}" \
      --max-new-tokens "$(dry 16 128)" --configs "${SMOL_TAU_CONFIGS:-tree,chain}" \
      --max-seconds "$(dry 30 "${SMOL_TAU_S:-50}")" --out "$OUT/tau_smol_$3.json" ;;
  qwen-levers)  # Qwen drafts from nothing at equal steps (QWEN_STEPS), one lever changed each (QWEN_VARIANTS), at most
                # QWEN_LANES of them sharing the GPU; then all of them, and INIT_DRAFT as the reference, teacher-forced on
                # the fixed target texts of QWEN_ANSWERS (an accept_matrix.json: no answers generated, no near-tie noise)
    variants=${QWEN_VARIANTS:-base nochat nolong nosoft noinit python} drafts=
    for v in $variants; do
      while [ "$(jobs -rp | wc -l)" -ge "${QWEN_LANES:-2}" ]; do sleep 2; done
      bash benchmarks/lease_h200.sh qwen-train "$v" &
    done
    wait
    for v in $variants; do  # the variants whose training ended with a saved draft
      [ ! -f "$HOME/draft-qwen-$v/config.json" ] || drafts="$drafts,$v=$HOME/draft-qwen-$v"
    done
    init=$(init_draft)
    [ "$DRY" = 1 ] || [ -z "$init" ] || [ ! -f "$init" ] || drafts=",shipped=$init$drafts"
    [ -n "$drafts" ] || { echo "qwen-levers: no draft trained"; exit 1; }
    pkg /tmp/pkg-levers
    python3 benchmarks/accept_matrix.py --target "$HOME/qwen15" --drafts "${drafts#,}" --dtype "$(dry float32 bfloat16)" \
      ${QWEN_ANSWERS:+--answers "$QWEN_ANSWERS"} --datasets summarization,heldout:4,code_completion \
      --buckets "$(dry 2048 8192,16384,30000)" --per-bucket "$(dry 1 2)" --max-new-tokens "$(dry 16 256)" \
      --max-seconds "$(dry 120 "${ACCEPT_S:-240}")" --out "$OUT/accept_levers.json" ;;
  qwen-train)  # qwen-train VARIANT: a new Qwen draft into ~/draft-qwen-VARIANT with one lever of the recipe changed
    draft_set=${DRAFT_SET:-'{}'} mix_set="" extra=""
    case $2 in
      base) ;;
      nochat) mix_set=', "chat_prompts": 0, "chat_long_prompts": 0, "chat_parts_prompts": 0, "chat_prompts_cache": null' ;;
      nolong) mix_set=', "long_rows": 0, "rows_cache": null' ;;  # the shared rows cache holds long rows
      nosoft) extra="--set soft_labels_topk=0 --set draft_vocab_loss=false" ;;  # draft_vocab_loss is a soft-label term
      noinit) draft_set=$(json_with "$draft_set" '{"init_from_target": false}') ;;  # random init
      python) mix_set=', "kinds": {"python": 1.0}, "rows_cache": null' ;;  # the data mix: Python sources only
      *) echo "qwen-train: unknown variant '$2' (base nochat nolong nosoft noinit python)" >&2; exit 2 ;;
    esac
    OUT=$OUT/$2 DRAFT=$HOME/draft-qwen-$2 TARGET=$HOME/qwen15 RECIPE=$RECIPE PKG=/tmp/pkg-qwen-$2 DRY_RUN=$DRY \
      DRAFT_SET="$draft_set" MIX_SET="$(qwen_mix ", \"chat_time_budget_s\": 0$mix_set")" \
      CHAT_CACHE=$HOME/chat-cache-qwen15.jsonl \
      TRAIN_EXTRA="--max-steps $(dry 4 "${QWEN_STEPS:-250}") --max-minutes $(dry 2 "${QWEN_MIN:-9}") ${TRAIN_SET:-} $extra" \
      bash benchmarks/gpu_train_mix.sh ;;
  sync)
    cp -r src trainers kernels benchmarks "$L/repo"/ && echo "synced into $L/repo" ;;
  preflight)  # preflight CARRY...: on this machine, before `launch`: what the launch call sends (work tree + CARRY)
    # against the device tool's 64 MiB (session 20: a refused launch went unseen and the next `wait` held an idle GPU)
    bytes=$( { git ls-files -co --exclude-standard -z; for p in "${@:2}"; do find "$p" -type f -print0; done; } |
      du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    echo "launch call sends $((bytes / 1048576)) MiB (work tree + ${*:2})"
    [ "$bytes" -le $((62 * 1048576)) ] || { echo "over 62 MiB (a launch of 63.x MiB was refused in session 20): move drafts/*.safetensors out and set INIT_DRAFT to a carried file (.init; the default reads the int4 file there), and with SMOL=0 also src/transformers_longspec/drafts/ (the smol phase measures the bundled draft)" >&2; exit 1; } ;;
  wait)
    # no status file: no pipeline runs on this machine (a refused launch, or a fresh machine after a lost one)
    [ -f "$L/status" ] || { echo "no pipeline on this machine ($L/status missing): launch first" >&2; exit 3; }
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt "$end" ] && ! grep -q DONE "$L/status" 2>/dev/null; do sleep 5; done
    cat "$L/status"; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    tar czf "$OUT/lease.tgz" -C "$L" out status pipeline.log
    drafts=$(cd "$HOME" && ls -d draft-smol-final draft-smol-full draft-smol-nolayers 2>/dev/null)
    [ -z "$drafts" ] || tar czf "$OUT/drafts.tgz" -C "$HOME" $drafts
    # the Qwen draft's compact file in parts of 15 MiB (files come back at most 16 MiB each): cat the parts
    [ ! -f "$HOME/draft-qwen15.int8.safetensors" ] || \
      split -b 15M -d "$HOME/draft-qwen15.int8.safetensors" "$OUT/draft-qwen15.int8.safetensors.part"
    [ ! -f "$HOME/draft-qwen15.int4.safetensors" ] || \
      split -b 15M -d "$HOME/draft-qwen15.int4.safetensors" "$OUT/draft-qwen15.int4.safetensors.part"
    [ ! -f "$HOME/chat-cache-qwen15.jsonl" ] || \
      gzip -9c "$HOME/chat-cache-qwen15.jsonl" > "$OUT/chat-answers-qwen15.jsonl.gz"
    ls -la "$OUT" ;;
  *)
    echo "usage: bash benchmarks/lease_h200.sh preflight CARRY... | launch | sync | wait SECS" >&2; exit 2 ;;
esac
