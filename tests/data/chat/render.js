// Reference renderer for the chat template and Jinja tests: Hugging Face's
// own Jinja (@huggingface/jinja, from the npm assets) renders each case.
// Reads a JSON array of cases from IN, each either
//   {"template": JINJA, "context": {VARIABLES}}          (rendered as given)
// or a chat case, rendered with what apply_chat_template passes:
//   {"template": JINJA, "messages": [...], "bos_token": ..., "eos_token": ...,
//    "add_generation_prompt": bool, "tools": [...] (optional; null when not
//    given, as transformers passes it), "special_tokens": {NAME: TEXT}}
// and writes to OUT a JSON array of {"text": RENDERED} or {"error": MESSAGE}
// (a syntax error, or the template's raise_exception, which the library
// defines).
//   node render.js IN OUT
'use strict';
const fs = require('fs');
const path = require('path');
const [inPath, outPath] = process.argv.slice(2);
const assets = process.env.NEKTON_ASSETS || path.join(__dirname, '..', '..', '..', 'assets');
const {Template} = require(path.join(assets, 'npm', 'node_modules', '@huggingface', 'jinja'));

function contextOf(c) {
  if (c.context) return c.context;
  const ctx = {
    messages: c.messages,
    bos_token: c.bos_token,
    eos_token: c.eos_token,
    add_generation_prompt: c.add_generation_prompt,
    tools: c.tools === undefined ? null : c.tools,
  };
  for (const [k, v] of Object.entries(c.special_tokens || {})) ctx[k] = v;
  return ctx;
}

const cases = JSON.parse(fs.readFileSync(inPath, 'utf8'));
const out = cases.map((c) => {
  try {
    return {text: new Template(c.template).render(contextOf(c))};
  } catch (e) {
    return {error: String(e.message)};
  }
});
fs.writeFileSync(outPath, JSON.stringify(out));
