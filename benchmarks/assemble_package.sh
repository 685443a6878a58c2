#!/usr/bin/env bash
# Assemble the importable package under DIR (default /tmp/pkg) from the work tree, as pyproject.toml's package-dir
# maps it, for machines where it cannot be pip-installed (the GPU machine: no network). Then PYTHONPATH=DIR.
#   bash benchmarks/assemble_package.sh /tmp/pkg-bench
# Each lease script uses its own DIR: two scripts assembling one folder at once break each other.
set -euo pipefail
dir=${1:-/tmp/pkg}
mkdir -p "$dir" && rm -rf "$dir/transformers_longspec"
cp -r src/transformers_longspec "$dir"/
cp -r kernels trainers model_cards "$dir"/transformers_longspec/
