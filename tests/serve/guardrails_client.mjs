// Drives a `nekton serve` with an input guardrail through OpenAI's official
// JavaScript client, for tests/serve/guardrails_e2e_test.cc:
//   node guardrails_client.mjs NODE_MODULES BASE_URL MODEL REFUSAL BLOCKED_TEXT
// A request with BLOCKED_TEXT gets REFUSAL with finish_reason
// "content_filter", whole and streamed, chat and completions; a harmless one
// is answered by the model. Prints {"checks": N}; a failed check throws.
import assert from "node:assert/strict";
import {pathToFileURL} from "node:url";

const [modules, baseURL, model, refusal, blocked] = process.argv.slice(2);
const {default: OpenAI} = await import(pathToFileURL(`${modules}/openai/index.mjs`).href);
const client = new OpenAI({apiKey: "unused", baseURL: `${baseURL}/v1`, maxRetries: 0, timeout: 60000});

let checks = 0;
const check = (cond, what) => {
  assert.ok(cond, what);
  ++checks;
};

const messages = [{role: "user", content: blocked}];
const whole = await client.chat.completions.create({model, messages, max_tokens: 8});
check(whole.choices[0].message.content === refusal, `chat refusal: ${whole.choices[0].message.content}`);
check(whole.choices[0].finish_reason === "content_filter", "chat finish_reason content_filter");
check(whole.usage.completion_tokens === 0, "the model did not run");

let text = "", finish = null, role = null;
for await (const c of await client.chat.completions.create({model, messages, max_tokens: 8, stream: true})) {
  for (const ch of c.choices) {
    role ??= ch.delta.role;
    text += ch.delta.content ?? "";
    finish = ch.finish_reason ?? finish;
  }
}
check(role === "assistant" && text === refusal && finish === "content_filter", "streamed chat refusal");

const comp = await client.completions.create({model, prompt: blocked, max_tokens: 8, n: 2});
check(comp.choices.length === 2 && comp.choices.every((c) => c.text === refusal &&
      c.finish_reason === "content_filter"), "completions: every choice refused");

const ok = await client.chat.completions.create(
    {model, messages: [{role: "user", content: "Hello there"}], max_tokens: 4, temperature: 0});
check(ok.choices[0].finish_reason === "length" && ok.usage.completion_tokens === 4,
      "a harmless request reaches the model");
console.log(JSON.stringify({checks}));
