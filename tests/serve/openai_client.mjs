// Drives a running `nekton serve` with OpenAI's official JavaScript client
// (npm `openai`, fetched by scripts/fetch_assets.sh --test) for tests/serve/serve_e2e_test.cc.
//   node openai_client.mjs NODE_MODULES BASE_URL MODEL MODE
// MODE:
//   api    chat and completions, streamed and not, stop strings, n = 2 with
//          seeds, logprobs, usage, errors as the client raises them; prints
//          {"completion": TEXT, "chat": TEXT, "checks": N} (greedy outputs
//          of the prompts the C++ side also gives `nekton generate`)
//   load   64 concurrent streaming requests; prints {"streams": 64, "errors": 0}
//   abort  a stream aborted after its first tokens; prints {"aborted": true}
// Any failed check throws: the exit status is not 0 and stderr says which.
import assert from "node:assert/strict";
import {pathToFileURL} from "node:url";

const [modules, baseURL, model, mode] = process.argv.slice(2);
const {default: OpenAI} = await import(pathToFileURL(`${modules}/openai/index.mjs`).href);
const client = new OpenAI({apiKey: "unused", baseURL: `${baseURL}/v1`, maxRetries: 0, timeout: 60000});

const COMPLETION_PROMPT = "The quick brown fox";
const CHAT_MESSAGES = [{role: "user", content: "Hello there"}];
let checks = 0;
const check = (cond, what) => {
  assert.ok(cond, what);
  ++checks;
};

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

// Each choice's text of a streamed completion, and its finish reasons.
function joinStream(chunks, chat) {
  const text = {}, finish = {};
  for (const c of chunks)
    for (const ch of c.choices) {
      const piece = chat ? ch.delta.content ?? "" : ch.text;
      text[ch.index] = (text[ch.index] ?? "") + piece;
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  return {text, finish};
}

async function expectError(promise, status, param, what) {
  try {
    await promise;
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: an APIError, got ${e}`);
    check(e.status === status, `${what}: status ${e.status}, want ${status}`);
    check(e.error?.type === "invalid_request_error", `${what}: type ${e.error?.type}`);
    if (param !== undefined) check(e.param === param, `${what}: param ${e.param}, want ${param}`);
    return e;
  }
  assert.fail(`${what}: no error`);
}

async function api() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model, "models.list names the model");

  // Completions, greedy: whole, then streamed with usage.
  const greedy = {model, prompt: COMPLETION_PROMPT, max_tokens: 8, temperature: 0};
  const c1 = await client.completions.create(greedy);
  check(c1.object === "text_completion" && c1.model === model, "completion object and model");
  check(c1.choices.length === 1 && c1.choices[0].index === 0, "one choice");
  const text = c1.choices[0].text;
  check(text.length > 0 && c1.choices[0].finish_reason === "length", "8 tokens, finish length");
  check(c1.usage.prompt_tokens === Buffer.byteLength(COMPLETION_PROMPT), "prompt tokens (bytes)");
  check(c1.usage.completion_tokens === 8 && c1.usage.total_tokens === c1.usage.prompt_tokens + 8,
        "usage counts");
  const sc = await collect(await client.completions.create(
      {...greedy, stream: true, stream_options: {include_usage: true}}));
  const sj = joinStream(sc, false);
  check(sj.text[0] === text && sj.finish[0] === "length", "streamed completion equals whole");
  const last = sc[sc.length - 1];
  check(last.choices.length === 0 && last.usage.completion_tokens === 8, "final usage chunk");
  check(sc.slice(0, -1).every((c) => c.usage === null), "usage null before the last chunk");

  // Chat, greedy: whole, then streamed (role first, content deltas, usage).
  const chatReq = {model, messages: CHAT_MESSAGES, max_tokens: 8, temperature: 0};
  const r1 = await client.chat.completions.create(chatReq);
  check(r1.object === "chat.completion", "chat object");
  const msg = r1.choices[0].message;
  check(msg.role === "assistant" && msg.content.length > 0, "assistant message");
  check(r1.choices[0].finish_reason === "length", "chat finish length");
  const tok = await (await fetch(`${baseURL}/tokenize`, {
    method: "POST",
    headers: {"content-type": "application/json"},
    body: JSON.stringify({model, messages: CHAT_MESSAGES}),
  })).json();
  check(r1.usage.prompt_tokens === tok.count && tok.count === tok.tokens.length,
        "chat prompt tokens equal /tokenize of the messages");
  const cc = await collect(await client.chat.completions.create(
      {...chatReq, stream: true, stream_options: {include_usage: true}}));
  check(cc[0].object === "chat.completion.chunk" && cc[0].choices[0].delta.role === "assistant",
        "the first chunk carries the role");
  const cj = joinStream(cc, true);
  check(cj.text[0] === msg.content && cj.finish[0] === "length", "streamed chat equals whole");
  check(cc[cc.length - 1].usage.total_tokens === r1.usage.total_tokens, "streamed chat usage");

  // A stop string: the text ends before its first occurrence.
  const stop = text.slice(3, 5);
  const want = text.slice(0, text.indexOf(stop));
  const s1 = await client.completions.create({...greedy, stop: [stop, "\u0001never"]});
  check(s1.choices[0].text === want && s1.choices[0].finish_reason === "stop",
        `stop ${JSON.stringify(stop)}: ${JSON.stringify(s1.choices[0].text)}`);
  const s2 = joinStream(await collect(await client.completions.create(
      {...greedy, stop, stream: true})), false);
  check(s2.text[0] === want && s2.finish[0] === "stop", "streamed stop");
  const s3 = await client.chat.completions.create({...chatReq, stop: msg.content.slice(2, 4)});
  check(s3.choices[0].message.content === msg.content.slice(0, msg.content.indexOf(msg.content.slice(2, 4))) &&
        s3.choices[0].finish_reason === "stop", "chat stop");

  // n = 2: choice j is the request with seed + j.
  const sampled = {model, prompt: COMPLETION_PROMPT, max_tokens: 12, temperature: 1, seed: 7};
  const two = await client.completions.create({...sampled, n: 2});
  check(two.choices.map((c) => c.index).join() === "0,1", "choices indexed 0, 1");
  check(two.usage.completion_tokens === 24, "usage counts both choices");
  for (const j of [0, 1]) {
    const one = await client.completions.create({...sampled, seed: 7 + j});
    check(one.choices[0].text === two.choices[j].text, `choice ${j} is seed ${7 + j}`);
  }
  check(two.choices[0].text !== two.choices[1].text, "the two seeds sample differently");
  const chatTwo = joinStream(await collect(await client.chat.completions.create(
      {model, messages: CHAT_MESSAGES, max_tokens: 6, temperature: 1, seed: 3, n: 2, stream: true})), true);
  check(Object.keys(chatTwo.text).length === 2 && chatTwo.finish[1] === "length", "streamed chat n=2");

  // Logprobs: chat's per-token entries, greedy picks the top one.
  const lp = await client.chat.completions.create({...chatReq, logprobs: true, top_logprobs: 3});
  const content = lp.choices[0].logprobs.content;
  check(content.length === lp.usage.completion_tokens, "one entry per token");
  check(Buffer.concat(content.map((e) => Buffer.from(e.bytes))).toString() === lp.choices[0].message.content,
        "entry bytes spell the content");
  for (const e of content) {
    check(e.top_logprobs.length === 3 && e.logprob <= 0, "three top entries, logprob <= 0");
    check(e.top_logprobs[0].token === e.token && Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6,
          "greedy: the token is the most likely");
    check(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob &&
          e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, "top entries sorted");
  }
  const lpStream = await collect(await client.chat.completions.create(
      {...chatReq, logprobs: true, top_logprobs: 2, stream: true}));
  const streamedEntries = lpStream.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
  check(streamedEntries.map((e) => e.token).join("") === content.map((e) => e.token).join(""),
        "streamed logprobs carry the same tokens");
  // Completions' parallel lists.
  const cl = await client.completions.create({...greedy, logprobs: 2});
  const L = cl.choices[0].logprobs;
  check(L.tokens.length === 8 && L.token_logprobs.length === 8 && L.top_logprobs.length === 8,
        "8 tokens of logprobs");
  check(L.tokens.join("") === text && L.text_offset[0] === 0, "tokens spell the text");
  check(L.top_logprobs.every((t) => Object.keys(t).length <= 2), "at most 2 top entries");
  check(L.token_logprobs.every((x, i) => Math.abs(x - Math.max(...Object.values(L.top_logprobs[i]))) < 1e-6),
        "greedy: each token is its step's most likely");

  // Penalties and the other sampling fields are accepted.
  const pen = await client.completions.create({...greedy, presence_penalty: 1.5, frequency_penalty: 1,
                                               top_p: 0.9, top_k: 20, min_p: 0.01, repetition_penalty: 1.1});
  check(pen.choices[0].text.length > 0, "penalised completion");

  // Errors as the client raises them.
  await expectError(client.completions.create({...greedy, model: "no-such-model"}), 404, "model",
                    "unknown model");
  await expectError(client.completions.create({...greedy, temperature: 5}), 400, "temperature",
                    "temperature out of range");
  await expectError(client.chat.completions.create({...chatReq, messages: []}), 400, "messages",
                    "empty messages");
  const big = await expectError(client.completions.create({...greedy, max_tokens: 100000}), 400,
                                "max_tokens", "max_tokens over the context");
  check(/100000/.test(big.message), "the message names the requested tokens");
  return {completion: text, chat: msg.content, checks};
}

async function load() {
  const N = 64;
  const expected = (await client.completions.create(
      {model, prompt: COMPLETION_PROMPT, max_tokens: 16, temperature: 0})).choices[0].text;
  let errors = 0;
  const one = async (i) => {
    try {
      if (i % 2 === 0) {
        // Greedy: every stream must give the text of the request alone.
        const chunks = await collect(await client.completions.create(
            {model, prompt: COMPLETION_PROMPT, max_tokens: 16, temperature: 0, stream: true}));
        const j = joinStream(chunks, false);
        assert.equal(j.text[0], expected, `stream ${i}`);
        assert.equal(j.finish[0], "length");
      } else {
        const chunks = await collect(await client.chat.completions.create(
            {model, messages: [{role: "user", content: `request ${i}`}], max_tokens: 16,
             temperature: 0.8, seed: i, stream: true}));
        const j = joinStream(chunks, true);
        assert.ok(j.text[0].length > 0 && j.finish[0] === "length", `stream ${i}`);
      }
    } catch (e) {
      ++errors;
      console.error(`stream ${i}: ${e}`);
    }
  };
  await Promise.all(Array.from({length: N}, (_, i) => one(i)));
  return {streams: N, errors};
}

async function abort() {
  const controller = new AbortController();
  const stream = await client.completions.create(
      {model, prompt: COMPLETION_PROMPT, max_tokens: 1900, temperature: 0, stream: true},
      {signal: controller.signal});
  let n = 0;
  for await (const c of stream) {
    if (c.choices[0]?.text) ++n;
    if (n === 3) {
      controller.abort();
      break;
    }
  }
  assert.equal(n, 3, "three pieces before the abort");
  return {aborted: true};
}

const modes = {api, load, abort};
if (!modes[mode]) throw new Error(`unknown mode ${mode}`);
console.log(JSON.stringify(await modes[mode]()));
