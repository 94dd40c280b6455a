// `nekton eval tasks` against harness_reference.py, an independent float64
// PyTorch computation of lm-evaluation-harness's definitions: on a tiny
// random Llama over bytes, the built-in HellaSwag, ARC, PIQA, LAMBADA and
// WikiText definitions and few-shot variants (same-split exclusion, a
// description, multiple golds, acc_bytes) on synthetic documents in their
// schemas; on the counting model (tests/infer/counting_model.h), a
// generate_until task with stop sequences, regex and take_first filters and
// exact_match options. Every prompt, every log-likelihood (within 1e-5),
// every greedy answer and every metric with its standard error is compared.
// Then the errors: malformed YAML, a missing field, a choice index out of
// range, Python-only keys, an https URL; each exits non-zero, names the file
// (and document and field), and writes nothing. Groups: eval_groups_cli_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "ckpt/model_io.h"
#include "eval_tasks_fixture.h"

namespace nk {
namespace {

using Json = nlohmann::ordered_json;
using test::contains;
using test::run_nekton;

TEST_F(EvalTasksCli, LoglikelihoodTasksMatchTheReference) {
  std::vector<Json> hs, arc, piqa, lam, wiki, train;
  for (int i = 0; i < 12; ++i) {
    Json choices = Json::array();
    for (int k = 0; k < 4; ++k) choices.push_back(words(1 + int(rng_() % 4)));
    hs.push_back({{"ind", i},
                  {"query", fmt::format("Label: {}", words(6))},
                  {"choices", choices},
                  {"label", std::to_string(rng_() % 4)}});
    arc.push_back(
        {{"id", fmt::format("q{}", i)},
         {"question", fmt::format("{}?", words(5))},
         {"choices", {{"text", {words(2), words(1), words(3)}}, {"label", {"A", "B", "C"}}}},
         {"answerKey", std::string(1, char('A' + rng_() % 3))}});
    piqa.push_back(
        {{"goal", words(4)}, {"sol1", words(3)}, {"sol2", words(2)}, {"label", int(rng_() % 2)}});
    lam.push_back({{"text", words(5 + int(rng_() % 6))}});
    train.push_back(arc.back());
  }
  std::vector<Json> mmlu, tqa;
  for (int i = 0; i < 6; ++i) {
    mmlu.push_back({{"question", fmt::format("  {}?\n", words(5))},
                    {"subject", "abstract_algebra"},
                    {"choices", {words(1), words(2), words(1), words(3)}},
                    {"answer", int(rng_() % 4)}});
    tqa.push_back(
        {{"question", fmt::format("{}?", words(4))},
         {"mc1_targets", {{"choices", {words(3), words(2), words(4)}}, {"labels", {1, 0, 0}}}}});
  }
  write_split("mmlu_abstract_algebra", "test", mmlu);
  write_split("truthfulqa_mc1", "validation", tqa);
  for (int i = 0; i < 4; ++i)
    wiki.push_back({{"page", fmt::format("{} .\n\n{}", words(10 + 12 * i), words(7))}});
  write_split("hellaswag", "validation", hs);
  write_split("arc_easy", "test", arc);
  write_split("piqa", "validation", piqa);
  write_split("lambada_openai", "test", lam);
  write_split("wikitext", "test", wiki);
  // Few-shot from the scored split itself (the document left out of its
  // own draw), with a description ending in a newline (Python Jinja keeps
  // it); and from a training split, with a list of golds, acc_bytes,
  // acc_mutual_info (unconditional requests after the conditional ones) and a
  // block tag before a newline and an indented line (no trim_blocks or
  // lstrip_blocks in the harness's Jinja).
  write_split("arc_shots", "test", arc);
  const std::string shots = yaml("arc_shots", R"(task: arc_shots
output_type: multiple_choice
test_split: test
fewshot_split: test
num_fewshot: 3
description: "Answer about {{id}}.\n\n"
doc_to_text: "Question: {{question}}\nAnswer:"
doc_to_target: "{{choices.label.index(answerKey)}}"
doc_to_choice: "{{choices.text}}"
)");
  std::vector<Json> multi;
  for (int i = 0; i < 8; ++i)
    multi.push_back({{"q", words(3)},
                     {"golds", {int(rng_() % 3), int(rng_() % 3)}},
                     {"opts", {words(1), fmt::format("é{}", words(1)), words(2)}}});
  write_split("multi_gold", "validation", multi);
  write_split("multi_gold", "train", std::vector<Json>(multi.begin(), multi.begin() + 5));
  const std::string mg = yaml("multi_gold", R"(task: multi_gold
output_type: multiple_choice
training_split: train
validation_split: validation
num_fewshot: 2
target_delimiter: " => "
fewshot_delimiter: "\n"
doc_to_text: "Q: {% if q %}{{q}}{% endif %}\n  A:"
doc_to_target: "{{golds}}"
doc_to_choice: opts
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_bytes
  - metric: acc_mutual_info
)");
  // Winogrande (multiple inputs): each choice a partial context, one shared
  // continuation, the gold doc_to_text's index; the built-in definition, and
  // a few-shot variant (inferred multiple-input, shots written with their
  // gold context) with acc_norm over the contexts' lengths.
  std::vector<Json> wino, wino_train;
  for (int i = 0; i < 10; ++i) {
    const std::string head = words(3 + int(rng_() % 3)) + " ";
    Json d = {{"gold", int(rng_() % 2)},
              {"contexts", {head + words(1), head + words(2)}},
              {"continuation", words(2 + int(rng_() % 3)) + "."}};
    (i < 7 ? wino : wino_train).push_back(d);
  }
  write_split("winogrande", "validation", wino);
  write_split("winogrande", "train", wino_train);
  write_split("wino_shots", "validation", wino);
  write_split("wino_shots", "train", wino_train);
  const std::string ws = yaml("wino_shots", R"(task: wino_shots
output_type: multiple_choice
training_split: train
validation_split: validation
num_fewshot: 2
description: "Fill in.\n"
doc_to_text: "{{gold}}"
doc_to_target: continuation
doc_to_choice: contexts
metric_list:
  - metric: acc
  - metric: acc_norm
)");
  // gen_prefix, a template and a field: the scored document's text after
  // the question and before every shot's answer.
  std::vector<Json> pre;
  for (int i = 0; i < 8; ++i)
    pre.push_back({{"q", words(3)},
                   {"lead", i % 3 ? "The answer is" : ""},
                   {"opts", {words(1), words(2)}},
                   {"gold", int(rng_() % 2)}});
  write_split("prefixed", "validation", pre);
  write_split("prefixed", "train", std::vector<Json>(pre.begin(), pre.begin() + 4));
  const std::string prefixed_task = R"(task: prefixed
output_type: multiple_choice
training_split: train
validation_split: validation
num_fewshot: 2
doc_to_text: "Q: {{q}}"
doc_to_target: gold
doc_to_choice: opts
)";
  const std::string pt = yaml("prefixed_t", prefixed_task + "gen_prefix: \"So, {{lead}}:\"\n");
  const std::string pf = yaml("prefixed_f", prefixed_task + "gen_prefix: lead\n");
  const std::string out = d_ / "results.json";
  auto r = run_nekton(
      "eval tasks eval.model=" + random_ +
      " eval.tasks=hellaswag,arc_easy,piqa,lambada_openai,wikitext,mmlu_abstract_algebra,"
      "truthfulqa_mc1,winogrande," +
      shots + "," + mg + "," + ws + "," + pt + " eval.data=" + data_ +
      " eval.batch_size=3 eval.write_out=100 eval.bootstrap_iters=3000 eval.output=" + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "|hellaswag")) << r.out;
  const Json res = Json::parse(test::read_file(out));
  EXPECT_EQ(res["n-shot"]["arc_shots"], 3);
  EXPECT_EQ(res["results"]["wikitext"]["bits_per_byte_stderr,none"], "N/A");
  EXPECT_EQ(res["results"]["mmlu_abstract_algebra"]["alias"], "abstract_algebra");
  // eval.limit scores the first N documents only.
  r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=piqa eval.data=" + data_ +
                 " eval.limit=5 eval.output=" + (d_ / "limit.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  const Json limited = Json::parse(test::read_file(d_ / "limit.json"))["n-samples"]["piqa"];
  EXPECT_EQ(limited["effective"], 5);
  EXPECT_EQ(limited["original"], 12);
  r = run_nekton("eval tasks --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "eval.apply_chat_template") && contains(r.out, "eval.num_fewshot"))
      << r.out;
  expect_reference({{kTasks + "hellaswag.yaml", random_},
                    {kTasks + "arc_easy.yaml", random_},
                    {kTasks + "piqa.yaml", random_},
                    {kTasks + "lambada_openai.yaml", random_},
                    {kTasks + "wikitext.yaml", random_},
                    {kTasks + "mmlu/mmlu_abstract_algebra.yaml", random_},
                    {kTasks + "truthfulqa_mc1.yaml", random_},
                    {shots, random_},
                    {mg, random_},
                    {kTasks + "winogrande.yaml", random_},
                    {ws, random_},
                    {pt, random_}},
                   out);
  // The field form: an empty prefix leaves the shots' answers as they were
  // but still puts target_delimiter after the question, as the harness.
  const std::string outf = d_ / "prefixed_f.json";
  r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=" + pf + " eval.data=" + data_ +
                 " eval.write_out=8 eval.bootstrap_iters=3000 eval.output=" + outf);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_reference({{pf, random_}}, outf);
  const std::string samples = test::read_file(outf + ".samples.jsonl");
  EXPECT_TRUE(contains(samples, " The answer is\",\"")) << samples;
}

TEST_F(EvalTasksCli, GenerateUntilWithFiltersMatchesTheReference) {
  // The counting model continues a text's last byte b with b+1, b+2, ...
  std::vector<Json> docs = {
      {{"q", "count from /"}, {"a", "01234"}},  // stops before "5": strict match
      {{"q", "letters @"}, {"a", "abcdefgh"}},  // ignore_case matches "ABCDEFGH"
      {{"q", "numbers ,"}, {"a", "-./01234"}},  // punctuation and "," ignored
      {{"q", "from 1"}, {"a", "999"}},          // no match
      {{"q", "late +"}, {"a", ",-./01"}},
  };
  write_split("counting", "test", docs);
  write_split("counting", "train", {{{"q", "shot ("}, {"a", ")*+"}}, {{"q", "x 7"}, {"a", "89"}}});
  const std::string y = yaml("counting", R"Y(task: counting
output_type: generate_until
training_split: train
test_split: test
num_fewshot: 1
doc_to_text: "{{q}}"
doc_to_target: "{{a}}"
generation_kwargs:
  until: ["5", "Q:"]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
    regexes_to_ignore: [","]
filter_list:
  - name: raw
    filter:
      - function: take_first
  - name: digits
    filter:
      - function: regex
        regex_pattern: "([0-9]+)"
      - function: take_first
  - name: flexible
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{2,})|(-?[0-9]+)"
      - function: take_first
)Y");
  const std::string out = d_ / "gen.json";
  auto r = run_nekton(
      "eval tasks eval.model=" + counting_ + " eval.tasks=" + y + " eval.data=" + data_ +
      " eval.batch_size=2 eval.write_out=5 eval.bootstrap_iters=3000 eval.output=" + out);
  ASSERT_EQ(r.code, 0) << r.out;
  const Json res = Json::parse(test::read_file(out));
  EXPECT_GT(res["results"]["counting"]["exact_match,raw"].get<double>(), 0.5);
  expect_reference({{y, counting_}}, out);
}

// Self-consistency, as the harness's gsm8k_cot_self_consistency asks it:
// generation_kwargs do_sample with a temperature and top_k, `repeats`
// answers a document, filters that take the first k and vote. The counting
// model's next byte after t is t + 1 (logit 64 against O(8) for the rest):
// at temperature 30 over the top 2 the other byte is drawn about a quarter
// of the time. The same eval.seed gives the same bytes, another seed other
// answers; every filtered answer and metric follows from the sample log's
// answers by the harness's rules; greedy repeats are the greedy answer, as
// many times.
TEST_F(EvalTasksCli, SampledRepeatsVoteAndFollowTheSeed) {
  std::vector<Json> docs;
  for (char ch : std::string("abcdefghijklmnop"))
    docs.push_back({{"q", std::string("n ") + ch}, {"a", std::string(1, char(ch + 1))}});
  write_split("sampled", "test", docs);
  const std::string head = R"Y(task: sampled
output_type: generate_until
test_split: test
doc_to_text: "{{q}}"
doc_to_target: "{{a}}"
filter_list:
  - name: first
    filter:
      - function: take_first
  - name: maj@3
    filter:
      - function: take_first_k
        k: 3
      - function: majority_vote
      - function: take_first
  - name: maj
    filter:
      - function: majority_vote
)Y";
  const std::string sampled = yaml("sampled", head + R"Y(repeats: 5
generation_kwargs:
  until: ["\n"]
  max_gen_toks: 1
  do_sample: true
  temperature: 30
  top_k: 2
)Y");
  auto run = [&](const std::string& y, const std::string& name, const std::string& extra = "") {
    const std::string out = d_ / (name + ".json");
    auto r = run_nekton("eval tasks eval.model=" + counting_ + " eval.tasks=" + y + " eval.data=" +
                        data_ + " eval.batch_size=4 eval.write_out=16 eval.output=" + out + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<Json> lines;
    std::istringstream in(test::read_file(out + ".samples.jsonl"));
    for (std::string line; std::getline(in, line);) lines.push_back(Json::parse(line));
    return std::pair(Json::parse(test::read_file(out))["results"]["sampled"], lines);
  };
  const auto [res, samples] = run(sampled, "a");
  const auto [res_again, samples_again] = run(sampled, "b");
  EXPECT_EQ(samples, samples_again);
  EXPECT_EQ(res, res_again);
  const auto [res_other, samples_other] = run(sampled, "c", " eval.seed=99");
  EXPECT_NE(samples, samples_other);

  ASSERT_EQ(samples.size(), docs.size());
  auto vote = [](const std::vector<std::string>& a) {  // Counter(a).most_common(1)[0][0]
    std::map<std::string, int> n;
    for (const auto& x : a) ++n[x];
    std::string best = a[0];
    for (const auto& x : a)
      if (n[x] > n[best]) best = x;
    return best;
  };
  int mixed = 0, checked = 0;
  std::map<std::string, double> right;
  for (const Json& s : samples) {
    const Json& kw = s["arguments"][0][1];
    EXPECT_TRUE(kw["do_sample"].get<bool>());
    EXPECT_EQ(kw["temperature"].get<double>(), 30.0);
    EXPECT_EQ(kw["top_k"].get<int64_t>(), 2);
    ASSERT_EQ(s["resps"].size(), 5u);
    std::vector<std::string> a;
    for (const Json& x : s["resps"]) a.push_back(x.get<std::string>());
    mixed += std::set<std::string>(a.begin(), a.end()).size() > 1;
    const std::string gold = s["target"].get<std::string>();
    for (const char* f : {"first", "maj@3", "maj"})
      right[f] += s["filtered_resps"][f].get<std::string>() == gold ? 1.0 : 0.0;
    // A byte past 127 alone is no UTF-8: the log writes it as U+FFFD, so
    // the votes are recounted only where every answer is kept whole.
    if (std::any_of(a.begin(), a.end(),
                    [](const std::string& x) { return contains(x, "\xEF\xBF\xBD"); }))
      continue;
    ++checked;
    EXPECT_EQ(s["filtered_resps"]["first"], a[0]);
    EXPECT_EQ(s["filtered_resps"]["maj@3"], vote({a.begin(), a.begin() + 3}));
    EXPECT_EQ(s["filtered_resps"]["maj"], vote(a));
  }
  EXPECT_GT(mixed, 3) << "the answers should be samples, not one greedy answer";
  EXPECT_GE(checked, 3);
  for (const char* f : {"first", "maj@3", "maj"})
    EXPECT_DOUBLE_EQ(res[std::string("exact_match,") + f].get<double>(),
                     right[f] / double(docs.size()))
        << f;

  // Greedy repeats: one answer, three times; every filter gives it.
  const std::string greedy = yaml("greedy", head + R"Y(repeats: 3
generation_kwargs:
  until: ["\n"]
  max_gen_toks: 2
)Y");
  const auto [gres, gsamples] = run(greedy, "g");
  for (const Json& s : gsamples) {
    EXPECT_FALSE(s["arguments"][0][1]["do_sample"].get<bool>());
    const std::string q = s["doc"]["q"].get<std::string>();
    const std::string want{char(q.back() + 1), char(q.back() + 2)};
    EXPECT_EQ(s["resps"], Json::array({want, want, want}));
    for (const char* f : {"first", "maj@3", "maj"}) EXPECT_EQ(s["filtered_resps"][f], want);
  }
}

// The sampling and self-consistency keys a task can get wrong, and a
// gen_prefix a chat template rewrites: each names the task file and the key,
// exits non-zero and writes nothing.
TEST_F(EvalTasksCli, BadSamplingAndRepeatsAreNamed) {
  write_split("bad", "test", {{{"q", "x"}, {"a", "y"}}});
  const std::string out = d_ / "bad.json";
  const std::string head =
      "task: bad\noutput_type: generate_until\ntest_split: test\ndoc_to_text: \"{{q}}\"\n"
      "doc_to_target: \"{{a}}\"\n";
  const std::pair<std::string, std::string> cases[] = {
      {"generation_kwargs:\n  do_sample: true\n",
       "generation_kwargs.temperature: do_sample: true needs a temperature > 0"},
      {"generation_kwargs:\n  temperature: 0.7\n",
       "generation_kwargs.temperature: 0.7 without do_sample: true"},
      {"generation_kwargs:\n  do_sample: true\n  temperature: 1\n  top_p: 1.5\n",
       "generation_kwargs.top_p: must be in (0, 1]"},
      {"repeats: 0\n", "repeats: must be >= 1, got 0"},
      {"repeats: 4\nfilter_list:\n  - name: f\n    filter:\n      - function: take_first_k\n"
       "        k: 5\n      - function: majority_vote\n",
       "filter_list[0].filter[0].k: take_first_k 5 of 4 answer(s) per document"},
      {"repeats: 4\nfilter_list:\n  - name: f\n    filter:\n      - function: regex\n",
       "filter_list[0].filter: leaves 4 answers per document (repeats 4); end it with "
       "take_first or majority_vote"},
      {"repeats: 2\nfilter_list:\n  - name: f\n    filter:\n      - function: take_first_k\n",
       "filter_list[0].filter[0].k: missing"},
  };
  for (const auto& [yaml_tail, message] : cases) {
    const std::string y = yaml("bad", head + yaml_tail);
    auto r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=" + y +
                        " eval.data=" + data_ + " eval.output=" + out);
    EXPECT_EQ(r.code, 1) << yaml_tail;
    EXPECT_TRUE(contains(r.out, "bad.yaml: " + message)) << yaml_tail << "\n" << r.out;
  }
  const std::string mc = yaml("mc",
                              "task: bad\noutput_type: multiple_choice\ntest_split: test\n"
                              "doc_to_text: q\ndoc_to_target: 0\ndoc_to_choice: [a, b]\n"
                              "repeats: 2\n");
  auto r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=" + mc +
                      " eval.data=" + data_ + " eval.output=" + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "mc.yaml: repeats: 2 with output_type multiple_choice")) << r.out;
  // gen_prefix under a chat template that rewrites the assistant's text:
  // the prefix cannot be continued (transformers' continue_final_message
  // refuses it too), named.
  const std::string gp = yaml("gp", head + "gen_prefix: \"a:\"\n");
  const std::string upper = d_ / "upper.jinja";
  test::write_file(upper,
                   "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}\n{% endfor %}"
                   "{% if add_generation_prompt %}<assistant>{% endif %}");
  r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=" + gp + " eval.data=" + data_ +
                 " eval.apply_chat_template=true eval.chat_template=" + upper +
                 " eval.output=" + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out,
                       "bad/test.jsonl document 0: chat template: continue_final_message: the "
                       "final message does not appear") &&
              contains(r.out, "gp.yaml"))
      << r.out;
  EXPECT_FALSE(std::filesystem::exists(out));
}

// --system_instruction and --apply_chat_template (the model folder's own
// template, from tokenizer_config.json), with the shots as one user turn or
// as turns of their own: the same prompts and scores as the reference.
TEST_F(EvalTasksCli, ChatTemplateAndSystemInstructionMatchTheReference) {
  const std::string tmpl =
      "{% for m in messages %}\n<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}\n"
      "{% if add_generation_prompt %}<assistant>{% endif %}";
  test::write_file(random_ + "/tokenizer_config.json", Json{{"chat_template", tmpl}}.dump());
  std::vector<Json> docs, train;
  // "lead": a gen_prefix field, empty in some documents (then the harness
  // renders a generation prompt as without one).
  for (int i = 0; i < 6; ++i)
    docs.push_back({{"q", words(4)},
                    {"opts", {words(1), words(2), words(1)}},
                    {"label", int(rng_() % 3)},
                    {"lead", i % 3 ? "Answer: " : ""}});
  for (int i = 0; i < 4; ++i)
    train.push_back({{"q", words(3)}, {"opts", {words(1), words(1)}}, {"label", int(rng_() % 2)}});
  for (const char* name : {"chatty", "chatty_f", "chatty_t"}) {
    write_split(name, "test", docs);
    write_split(name, "train", train);
  }
  const std::string chatty = R"Y(output_type: multiple_choice
training_split: train
test_split: test
num_fewshot: 2
description: "Pick one."
doc_to_text: "{{q}}?"
doc_to_target: label
doc_to_choice: opts
)Y";
  const std::string y = yaml("chatty", "task: chatty\n" + chatty);
  // gen_prefix under the template: the assistant's turn opened by it and
  // continued (continue_final_message: the closing tag cut, the prefix's
  // trailing space with it, as transformers cuts), the shots' answers led
  // by it; a field, empty in some documents, and a template.
  const std::string yf = yaml("chatty_f", "task: chatty_f\n" + chatty + "gen_prefix: lead\n");
  const std::string yt =
      yaml("chatty_t", "task: chatty_t\n" + chatty + "gen_prefix: \"So {{q[:3]}}:\"\n");
  for (const bool multiturn : {false, true}) {
    SCOPED_TRACE(multiturn);
    const std::string out = d_ / (multiturn ? "multi.json" : "single.json");
    auto r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=" + y + "," + yf + "," +
                        yt + " eval.data=" + data_ +
                        " 'eval.system_instruction=Be brief.' eval.apply_chat_template=true "
                        "eval.fewshot_as_multiturn=" +
                        (multiturn ? "true" : "false") +
                        " eval.write_out=6 eval.bootstrap_iters=3000 eval.output=" + out);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "<system>Be brief.\n\nPick one.</system>")) << r.out;
    EXPECT_TRUE(contains(r.out, "<assistant>Answer:")) << r.out;
    expect_reference(
        {{y, random_}, {yf, random_}, {yt, random_}}, out,
        {{"system_instruction", "Be brief."}, {"chat_template", tmpl}, {"multiturn", multiturn}});
  }
  // A system instruction without a chat template leads the plain prompt.
  const std::string out = d_ / "plain.json";
  auto r =
      run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=" + y + " eval.data=" + data_ +
                 " 'eval.system_instruction=Be brief.' eval.write_out=6 " +
                 "eval.bootstrap_iters=3000 eval.output=" + out);
  ASSERT_EQ(r.code, 0) << r.out;
  expect_reference({{y, random_}}, out, {{"system_instruction", "Be brief."}});
  r = run_nekton("eval tasks eval.model=" + random_ + " eval.tasks=" + y + " eval.data=" + data_ +
                 " eval.fewshot_as_multiturn=true");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "eval.fewshot_as_multiturn: needs eval.apply_chat_template"))
      << r.out;
}

// The same tasks on the model's GGUF export (f32): the same accuracies and
// log-likelihoods (within 1e-5), through the same engine.
TEST_F(EvalTasksCli, GgufExportScoresTheSame) {
  std::vector<Json> hs, lam;
  for (int i = 0; i < 8; ++i) {
    hs.push_back({{"query", words(5)},
                  {"choices", {words(1), words(2), words(3)}},
                  {"label", std::to_string(rng_() % 3)}});
    lam.push_back({{"text", words(6)}});
  }
  write_split("hellaswag", "validation", hs);
  write_split("lambada_openai", "test", lam);
  const std::string gguf = d_ / "random.gguf";
  auto r = run_nekton("export gguf " + random_ + " " + gguf + " --type f32 --tokenizer bytes");
  ASSERT_EQ(r.code, 0) << r.out;
  auto scores = [&](const std::string& model, const std::string& out) {
    auto e = run_nekton("eval tasks eval.model=" + model + " eval.tasks=hellaswag,lambada_openai " +
                        "eval.data=" + data_ + " eval.write_out=8 eval.output=" + out);
    EXPECT_EQ(e.code, 0) << e.out;
    return Json::parse(test::read_file(out))["results"];
  };
  const Json a = scores(random_, d_ / "folder.json"), b = scores(gguf, d_ / "gguf.json");
  EXPECT_EQ(a["hellaswag"]["acc,none"], b["hellaswag"]["acc,none"]);
  EXPECT_EQ(a["hellaswag"]["acc_norm,none"], b["hellaswag"]["acc_norm,none"]);
  EXPECT_EQ(a["lambada_openai"]["acc,none"], b["lambada_openai"]["acc,none"]);
  const double pa = a["lambada_openai"]["perplexity,none"],
               pb = b["lambada_openai"]["perplexity,none"];
  EXPECT_NEAR(std::log(pa), std::log(pb), 1e-5);
  auto lines = [](const std::string& path) {
    std::vector<Json> out;
    std::istringstream in(test::read_file(path));
    for (std::string l; std::getline(in, l);) out.push_back(Json::parse(l));
    return out;
  };
  const std::vector<Json> sa = lines(d_ / "folder.json.samples.jsonl"),
                          sb = lines(d_ / "gguf.json.samples.jsonl");
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    for (size_t k = 0; k < sa[i]["resps"].size(); ++k)
      EXPECT_NEAR(sa[i]["resps"][k][0].get<double>(), sb[i]["resps"][k][0].get<double>(), 1e-5);
}

TEST_F(EvalTasksCli, BadTasksAndDocumentsAreNamedAndWriteNothing) {
  const std::string out = d_ / "bad.json";
  auto run = [&](const std::string& task, const std::string& model = "") {
    return run_nekton("eval tasks eval.model=" + (model.empty() ? random_ : model) +
                      " eval.tasks=" + task + " eval.data=" + data_ + " eval.output=" + out);
  };
  // Malformed YAML: the file and line.
  std::string y = yaml("broken", "task: broken\ndoc_to_text: [unclosed\n");
  auto r = run(y);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "broken.yaml:") && contains(r.out, "malformed YAML")) << r.out;
  // Python the port cannot run.
  y = yaml("py",
           "task: py\ntest_split: test\ndoc_to_text: x\ndoc_to_target: y\n"
           "process_docs: !function utils.process_docs\n");
  r = run(y);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "py.yaml") && contains(r.out, "process_docs")) << r.out;
  // A document without the field a template reads.
  write_split("piqa", "validation",
              {{{"goal", "g"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 0}},
               {{"sol1", "a"}, {"sol2", "b"}, {"label", 1}}});
  r = run("piqa");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "piqa.yaml") && contains(r.out, "validation.jsonl document 1") &&
              contains(r.out, "doc_to_text") && contains(r.out, "'goal' is undefined"))
      << r.out;
  // A choice index out of range.
  write_split("piqa", "validation",
              {{{"goal", "g"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 0}},
               {{"goal", "g"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 1}},
               {{"goal", "g"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 2}}});
  r = run("piqa");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "document 2") && contains(r.out, "doc_to_target") &&
              contains(r.out, "choice index 2 is out of range"))
      << r.out;
  // Winogrande: a gold context index out of range names doc_to_text; a
  // document whose doc_to_text is not an index after one that is.
  write_split("winogrande", "validation",
              {{{"gold", 1}, {"contexts", {"a", "b"}}, {"continuation", "c"}},
               {{"gold", 2}, {"contexts", {"a", "b"}}, {"continuation", "c"}}});
  r = run("winogrande");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "winogrande.yaml") &&
              contains(r.out,
                       "winogrande/validation.jsonl document 1: doc_to_text: choice "
                       "index 2 is out of range"))
      << r.out;
  write_split("winogrande", "validation",
              {{{"gold", 1}, {"contexts", {"a", "b"}}, {"continuation", "c"}},
               {{"gold", "b"}, {"contexts", {"a", "b"}}, {"continuation", "c"}}});
  r = run("winogrande");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "document 1: doc_to_text: \"b\" is not a context's index")) << r.out;
  // multiple_inputs: true where doc_to_text is text.
  write_split("winogrande", "validation",
              {{{"gold", "a"}, {"contexts", {"a", "b"}}, {"continuation", "c"}}});
  r = run("winogrande");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "document 0: doc_to_text: multiple_inputs is true")) << r.out;
  // A choices field missing from a document (hellaswag reads "choices").
  write_split("hellaswag", "validation", {{{"query", "q"}, {"label", "0"}}});
  r = run("hellaswag");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out,
                       "hellaswag/validation.jsonl document 0: doc_to_choice: the "
                       "document has no field 'choices'"))
      << r.out;
  std::filesystem::remove_all(data_ + "/hellaswag");
  // A missing data file, an unknown task, an unknown key, a server URL.
  r = run("hellaswag");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "hellaswag/validation.jsonl")) << r.out;
  // The mmlu group runs its subjects (stem's first, as its YAML lists the
  // categories): the first one's data is missing here.
  r = run("mmlu");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "mmlu_abstract_algebra/test.jsonl")) << r.out;
  r = run("no_such_task");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "no_such_task")) << r.out;
  y = yaml("typo",
           "task: typo\ntest_split: test\ndoc_to_text: x\ndoc_to_target: y\nnum_fewshots: 2\n");
  r = run(y);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "typo.yaml: num_fewshots: unknown key")) << r.out;
  // (A server URL is served: eval_server_test.cc; https is not.)
  r = run("piqa", "https://localhost:8000/v1");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "eval.model") && contains(r.out, "https")) << r.out;
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".samples.jsonl"));
}

}  // namespace
}  // namespace nk
