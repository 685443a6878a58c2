# sourced on the device (and in the DRY run) before `lease_h200.sh launch`
eval "$(grep '^PROSE_MIX=' benchmarks/lease_h200.sh)"
R=$HOME/lease/repo
export INIT_DRAFT=$R/.init/draft-s25.int8.safetensors
export QWEN_MIX="\"short_rows\": 24000, \"prose_roots\": [\"$R/.prose\"], \"chat_parts_prompts\": 128, $PROSE_MIX"
export CHAT_ROUNDS=3 CHAT_S=300 TRAIN_MIN=7 TAU_S=150 TAU4_S=0 ACCEPT_S=200 TAU_BUCKETS=8192,16384,30000 BENCH_S=0
export PROFILE_CONTEXTS=none PROFILE_TRAIN=0 TESTS_S=1
export TRAIN_SET="--set noise_offsets_per_step=4 --set draft_vocab_loss=true --set learning_rate=0.00025 --set data_seed=26"
export SMOL=1 SMOL_VARIANTS= SMOL_FINAL_MIN=9 SMOL_FINAL_STEPS=4000 SMOL_S=960 SMOL_INIT=$R/src/transformers_longspec/drafts/smollm2-135m-instruct
export SMOL_MIX="\"prose_roots\": [\"$R/.prose\"], $PROSE_MIX, \"chat_time_budget_s\": 150, \"chat_parts_prompts\": 256"
