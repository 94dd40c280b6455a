// Reference renderer for the chat template tests: Hugging Face's own Jinja
// (@huggingface/jinja, from the npm assets) renders each case's published
// template. Reads a JSON array of cases from IN:
//   {"template": JINJA, "messages": [...], "bos_token": ..., "eos_token": ...,
//    "add_generation_prompt": bool}
// and writes to OUT a JSON array of {"text": RENDERED} or {"error": MESSAGE}
// (the template's raise_exception, which the library defines).
//   node render.js IN OUT
'use strict';
const fs = require('fs');
const path = require('path');
const [inPath, outPath] = process.argv.slice(2);
const assets = process.env.NEKTON_ASSETS || path.join(__dirname, '..', '..', '..', 'assets');
const {Template} = require(path.join(assets, 'npm', 'node_modules', '@huggingface', 'jinja'));

const cases = JSON.parse(fs.readFileSync(inPath, 'utf8'));
const out = cases.map((c) => {
  try {
    const text = new Template(c.template).render({
      messages: c.messages,
      bos_token: c.bos_token,
      eos_token: c.eos_token,
      add_generation_prompt: c.add_generation_prompt,
    });
    return {text};
  } catch (e) {
    return {error: String(e.message)};
  }
});
fs.writeFileSync(outPath, JSON.stringify(out));
