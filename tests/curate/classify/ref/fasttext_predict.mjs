// Reference predictions from fastText compiled to WebAssembly (npm package
// fasttext.wasm.js), for the parity test of nk::curate::FastTextModel.
//   node fasttext_predict.mjs PACKAGE_DIR MODEL TEXTS.json K
// TEXTS.json: a JSON array of strings (one line each, no '\n'). Prints a JSON
// array with, per text, the k best [label, probability] pairs.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [pkg, model, textsFile, k] = process.argv.slice(2);
const { getFastTextModule, getFastTextClass } = await import(
  pathToFileURL(`${pkg}/dist/main/node.mjs`).href
);
const FastText = await getFastTextClass({ getFastTextModule });
const ft = await new FastText().loadModel(pathToFileURL(model).href);
const texts = JSON.parse(readFileSync(textsFile, "utf8"));
const out = texts.map((t) => {
  const v = ft.predict(t, Number(k), 0);
  const row = [];
  for (let i = 0; i < v.size(); i++) row.push([v.get(i)[1], v.get(i)[0]]);
  return row;
});
process.stdout.write(JSON.stringify(out) + "\n");
