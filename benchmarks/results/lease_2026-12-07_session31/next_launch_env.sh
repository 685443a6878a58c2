# sourced on the device before `lease_h200.sh launch` (prepared in session 31): issue 12's ablation at equal budget at
# Qwen scale (PIPELINE=pipeline-levers). Six new Qwen drafts of 200 steps each, one lever of the recipe changed in
# each (base, nochat, nolong, nosoft, noinit, python), two at a time on the GPU, then all six and session 25's draft
# (INIT_DRAFT, the reference) teacher-forced on session 30's fixed target texts (accept_matrix.py --answers: per-level
# acceptance, chain tau replayed, no near-tie noise). The kept chat answers only (CHAT_S=0, three rounds as in
# sessions 29-30). Stage Qwen alone (25 calls; SmolLM2 is not needed), copy session 25's int8 file into .init
# (`git show e7397f6:drafts/qwen2.5-coder-1.5b-instruct-s25.int8.safetensors`), launch with carry [".init",
# ".evaldata", ".prose"]. Expected: ~17 min from the launch to DONE.
eval "$(grep '^PROSE_MIX=' benchmarks/lease_h200.sh)"
R=$HOME/lease/repo
export PIPELINE=pipeline-levers INIT_DRAFT=$R/.init/draft-s25.int8.safetensors
export QWEN_MIX="\"short_rows\": 24000, \"prose_roots\": [\"$R/.prose\"], \"chat_parts_prompts\": 128, $PROSE_MIX"
export CHAT_ROUNDS=3 CHAT_S=0 SMOL=0
export TRAIN_SET="--set noise_offsets_per_step=4 --set draft_vocab_loss=true"
export QWEN_VARIANTS="base nochat nolong nosoft noinit python" QWEN_LANES=2 QWEN_STEPS=200 QWEN_MIN=6
export QWEN_ANSWERS=$R/benchmarks/results/lease_2026-12-07_session30/accept_matrix.json ACCEPT_S=240 LEVERS_S=1020
