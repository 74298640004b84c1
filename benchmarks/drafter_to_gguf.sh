#!/usr/bin/env bash
# The edge-spec demo drafter as a GGUF for llama.cpp's speculative mode (bench only, never in CI):
# materialize a self-contained HF checkpoint (the drafter shares the target's embedding), then
# llama.cpp's own convert_hf_to_gguf.py from the tree benchmarks/build_llamacpp.sh unpacked.
#   benchmarks/drafter_to_gguf.sh TARGET.gguf [DRAFTER_DIR] [OUT.gguf]
set -euo pipefail
target="$1"; drafter="${2:-models/smollm2-drafter}"; out="${3:-drafter.q8_0.gguf}"
src="${LLAMA_CPP_SRC:-${LLAMA_CPP_HOME:-$HOME/.cache/edge-spec/llama.cpp}/src/vendor/llama.cpp}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python -c "import sentencepiece" 2>/dev/null || python -m pip install --quiet sentencepiece  # the converter imports it
python -c "
import sys; from pathlib import Path
from edge_spec.distill.materialize import full_checkpoint
full_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))" "$drafter" "$target" "$tmp/hf"
PYTHONPATH="$src/gguf-py" python "$src/convert_hf_to_gguf.py" "$tmp/hf" --outfile "$out" --outtype q8_0
echo "wrote $out"
