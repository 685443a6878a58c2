# sourced on the device before `lease_h200.sh launch` (session 27, not run: no machine): SmolLM2 alone
# (PIPELINE=pipeline-smol), the bundled draft widened 1,536 -> 3,072 and continued; ~12 device-minutes with staging
eval "$(grep '^PROSE_MIX=' benchmarks/lease_h200.sh)"
R=$HOME/lease/repo
export PIPELINE=pipeline-smol SMOL_VARIANTS= SMOL_FINAL_STEPS=3000 SMOL_FINAL_MIN=6 SMOL_S=720
export SMOL_INIT=$R/src/transformers_longspec/drafts/smollm2-135m-instruct
export SMOL_DRAFT_SET='{"target_hidden_input": true, "intermediate_size": 3072}'
export SMOL_SET="--set learning_rate=0.0005 --set data_seed=27"
export SMOL_MIX="\"prose_roots\": [\"$R/.prose\"], $PROSE_MIX, \"chat_time_budget_s\": 120, \"chat_parts_prompts\": 256"
export SMOL_TAU_PER_BUCKET=2 SMOL_TAU_S=120 TESTS_S=1 BENCH_SMOL=0 SMOL_BUNDLED_TAU=0
