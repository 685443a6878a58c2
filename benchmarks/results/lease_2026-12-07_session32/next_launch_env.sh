# sourced on the device before `lease_h200.sh launch` (prepared in session 32): issue 12's reranked trees on the real
# target. No training: PIPELINE=pipeline-bench converts the staged Qwen2.5-Coder-1.5B-Instruct GGUF, then measures
# session 25's draft (INIT_DRAFT, the shipped one) with
#   tau:   the fixed tree [4,16,16,16,16] + 10 retrieval tokens beside the 68 best nodes of eight (six) levels of 16
#          + 10 (`longspec_tree_nodes`, tree.best_nodes; as many verified tokens) on summaries, held-out prose and
#          code at 8k / 16k / 30k, 2 prompts per bucket (tau_matrix.py, 256 new tokens)
#   bench: the graphed static-cache plain loop, the fixed tree and both reranked trees end to end in one process
#          (gpu_bench.sh greedy-retrieval: longspec_tree, longspec_ranked, longspec_ranked6)
# Stage Qwen alone (25 calls), copy session 25's int8 file into .init
# (`git show e7397f6:drafts/qwen2.5-coder-1.5b-instruct-s25.int8.safetensors`), launch with carry [".init",
# ".evaldata"]. Expected: ~16 min from the launch to DONE (convert 1.5, tau 8, bench 6.5).
R=$HOME/lease/repo
export PIPELINE=pipeline-bench INIT_DRAFT=$R/.init/draft-s25.int8.safetensors SMOL=0
export TAU_S=400 TAU_CONFIGS="tree+retrieval,tree:16-16-16-16-16-16-16-16@68+10,tree:16-16-16-16-16-16@68+10"
export TAU_DATASETS="summarization,heldout:4,code_completion"
export BENCH_S=300 BENCH_METHODS=plain_graph,longspec_tree,longspec_ranked,longspec_ranked6
export BENCH_DATASETS=heldout_prose,summarization,heldout,code_completion
