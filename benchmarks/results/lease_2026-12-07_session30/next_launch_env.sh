# sourced on the device before `lease_h200.sh launch` (prepared in session 30): issue 12's item 4, both drafts from
# scratch with the builder, each in <= 20 minutes from launch to trained draft. Qwen: the data phase's rows and
# prompts, its own chat answers (CHAT_KEPT= : none of earlier leases', one round, 240 s), then 10 minutes of steps
# from a new draft (INIT_DRAFT= ; initialised from the target's last layer). SmolLM2 beside it from the end of the
# data phase: a new draft (no SMOL_INIT), its own chat answers (150 s), 10 minutes of steps. Then tau only.
# Stage both GGUFs first: Qwen as always (25 calls), then `gguf-models stage smollm2-135m-instruct --repo .s135`
# and per chunk `gguf-models next --repo .s135` + a call with carry [".s135/.stage/cur"] running
# `bash .s135/.stage/cur/receive.sh`.
# Then launch with carry [".init", ".evaldata", ".prose"]. Expected: ~20 min from the launch to DONE (tau included).
eval "$(grep '^PROSE_MIX=' benchmarks/lease_h200.sh)"
R=$HOME/lease/repo
export INIT_DRAFT= CHAT_KEPT=
export QWEN_MIX="\"short_rows\": 24000, \"prose_roots\": [\"$R/.prose\"], \"chat_parts_prompts\": 128, $PROSE_MIX"
export CHAT_ROUNDS=1 CHAT_S=240 TRAIN_MIN=10 TAU4_S=0 ACCEPT_S=0
export TAU_S=200 TAU_BUCKETS=8192,16384,30000 TAU_CONFIGS=tree+retrieval,chain
export TAU_DATASETS=summarization,heldout:4,code_completion
export BENCH_S=0 PROFILE_CONTEXTS=none PROFILE_TRAIN=0 TESTS_S=1
export TRAIN_SET="--set noise_offsets_per_step=4 --set draft_vocab_loss=true"
export SMOL=1 SMOL_VARIANTS= SMOL_FINAL_MIN=10 SMOL_FINAL_STEPS=100000 SMOL_S=1000
unset SMOL_INIT
export SMOL_MIX="\"prose_roots\": [\"$R/.prose\"], $PROSE_MIX, \"chat_time_budget_s\": 150, \"chat_parts_prompts\": 256"
