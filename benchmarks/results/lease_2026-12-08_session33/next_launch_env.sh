# sourced on the device before `lease_h200.sh launch` (prepared in session 33): the default tree's reranked variant on
# the real target. No training: PIPELINE=pipeline-bench converts the staged Qwen2.5-Coder-1.5B-Instruct GGUF, then
# measures session 25's draft (INIT_DRAFT, the shipped one) with
#   tau:   the fixed tree [4,16,16,16,16] + 10 retrieval tokens beside the 68 best nodes of five levels of 16 + 10
#          (`tree_policy.reranked`: as many draft forwards and verified tokens) on summaries, held-out prose and code
#          at 8k / 16k / 30k, 2 prompts per bucket (tau_matrix.py, 256 new tokens)
#   bench: the graphed static-cache plain loop, LongSpec as a user gets it (the policy, which now weighs reranked
#          variants), the fixed tree and the five-level reranked tree end to end in one process
# Stage Qwen alone (25 calls, ~10 s each), copy session 25's int8 file into .init
# (`git show e7397f6:drafts/qwen2.5-coder-1.5b-instruct-s25.int8.safetensors`), move
# drafts/qwen2.5-coder-1.5b-instruct.int4.safetensors out of the work tree (the launch call's size), launch with
# carry [".init", ".evaldata"]. Expected: ~13 min from the launch to DONE (convert 1.2, tau 5, bench 6.5).
R=$HOME/lease/repo
export PIPELINE=pipeline-bench INIT_DRAFT=$R/.init/draft-s25.int8.safetensors SMOL=0
export TAU_S=240 TAU_CONFIGS="tree+retrieval,tree:16-16-16-16-16@68+10"
export TAU_DATASETS="summarization,heldout:4,code_completion"
export BENCH_S=300 BENCH_METHODS=plain_graph,longspec,longspec_tree,longspec_ranked5
export BENCH_DATASETS=summarization,heldout_prose,heldout,code_completion
