# sourced on the device before `lease_h200.sh launch` (prepared in session 29): session 25's int8 Qwen draft continued
# with the soft loss weighted 0.8 over the target's top 32 (recipe: 0.5 over the top 16), the kept chat answers only;
# the chat prompts come from the data phase (chat_prompts_cache), so the train phase's ~200 s go to steps (TRAIN_MIN 8)
eval "$(grep '^PROSE_MIX=' benchmarks/lease_h200.sh)"
R=$HOME/lease/repo
export INIT_DRAFT=$R/.init/draft-s25.int8.safetensors
export QWEN_MIX="\"short_rows\": 24000, \"prose_roots\": [\"$R/.prose\"], \"chat_parts_prompts\": 128, $PROSE_MIX"
export CHAT_ROUNDS=3 CHAT_S=0 TRAIN_MIN=8 TAU4_S=0 ACCEPT_S=150
export TAU_S=240 TAU_BUCKETS=8192,16384,30000 TAU_CONFIGS=tree+retrieval,tree:8-16-16-16-16+10
export TAU_DATASETS=summarization,heldout:4,code_completion
export BENCH_S=200 BENCH_METHODS=plain_graph,longspec_tree,longspec_wide BENCH_BUCKETS=8192
export BENCH_DATASETS=summarization,code_completion,heldout
export PROFILE_CONTEXTS=none PROFILE_TRAIN=0 TESTS_S=1
export TRAIN_SET="--set noise_offsets_per_step=4 --set draft_vocab_loss=true --set learning_rate=0.0005 --set data_seed=30 \
--set soft_labels_weight=0.8 --set soft_labels_topk=32"
export SMOL=0
