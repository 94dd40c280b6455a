#include "eval/task_runner.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "eval/metrics.h"
#include "eval/py_text.h"
#include "eval/task_docs.h"
#include "eval/task_prompt.h"

namespace nk {

namespace {

using Json = nlohmann::ordered_json;

// One document's requests and what its answers are judged against.
struct Prepared {
  std::string context;
  Json target;
  std::vector<std::string> choices;
  std::vector<int64_t> gold;            // multiple_choice: gold indices
  std::vector<std::string> gold_texts;  // loglikelihood*, generate_until
  size_t first = 0, count = 0;          // its requests
  Json arguments = Json::array();
};

// `field`: where the gold came from (doc_to_target, or a multiple-input
// task's doc_to_text).
int64_t choice_index(const Json& t, const std::vector<std::string>& choices, const DocRef& at,
                     const char* field = "doc_to_target") {
  if (t.is_number_integer()) {
    const int64_t i = t.get<int64_t>();
    if (i < 0 || i >= int64_t(choices.size()))
      at.fail_field(field, fmt::format("choice index {} is out of range (the document "
                                       "has {} choices)",
                                       i, choices.size()));
    return i;
  }
  if (t.is_string()) {
    auto it = std::find(choices.begin(), choices.end(), t.get<std::string>());
    if (it == choices.end())
      at.fail_field(field, fmt::format("{} is not one of the choices", t.dump()));
    return it - choices.begin();
  }
  at.fail_field(field, fmt::format("{} is neither a choice index nor a choice", t.dump()));
}

std::string as_text(const Json& t) {
  return t.is_string() ? t.get<std::string>() : t.dump();
}

}  // namespace

TaskResult run_task(const TaskConfig& c, EvalModel& model, const TaskRunOptions& opt) {
  TaskResult res;
  res.task = c.task;
  const TaskPrompter pr(c, opt.style);
  const TaskDocs docs = load_split(c, opt.data_dir, c.eval_split());
  const int64_t n = opt.limit > 0 ? std::min<int64_t>(opt.limit, int64_t(docs.docs.size()))
                                  : int64_t(docs.docs.size());
  res.num_fewshot = opt.num_fewshot >= 0 ? opt.num_fewshot : c.num_fewshot;
  res.n_docs = n;
  res.n_total = int64_t(docs.docs.size());
  TaskDocs pool;
  if (res.num_fewshot > 0)
    pool = c.fewshot_docs_split() == c.eval_split()
               ? docs
               : load_split(c, opt.data_dir, c.fewshot_docs_split());
  FewshotSampler sampler(c, &pool.docs);

  const bool mutual_info = std::any_of(c.metrics.begin(), c.metrics.end(), [](const MetricSpec& m) {
    return m.metric == "acc_mutual_info";
  });
  // The harness makes a multiple_choice task multiple-input (Winogrande: the
  // choices are contexts, the continuation shared) when the first document's
  // doc_to_text is an index rather than text.
  bool multiple_input = false;
  if (c.output_type == "multiple_choice" && n > 0) {
    const DocRef at0{&c, &docs.file, 0};
    multiple_input = pr.text(docs.docs[0], at0).is_number_integer();
    if (c.multiple_inputs && *c.multiple_inputs != multiple_input)
      at0.fail_field("doc_to_text",
                     *c.multiple_inputs
                         ? "multiple_inputs is true but doc_to_text is not an index of a context"
                         : "multiple_inputs is false but doc_to_text is an index");
    if (multiple_input && mutual_info)
      fail("{}: metric_list: acc_mutual_info is not defined for a multiple-input task", c.file);
  }
  // Every document becomes requests before the model runs: a bad one stops
  // the run before any work.
  std::vector<Prepared> prep(static_cast<size_t>(n));
  std::vector<LoglikelihoodRequest> ll_reqs;
  std::vector<std::string> rolling;
  std::vector<GenerateRequest> gens;
  for (int64_t i = 0; i < n; ++i) {
    const Json& doc = docs.docs[size_t(i)];
    const DocRef at{&c, &docs.file, i};
    std::vector<std::pair<const Json*, DocRef>> shots;
    for (int64_t k : sampler.draw(doc, res.num_fewshot))
      shots.push_back({&pool.docs[size_t(k)], DocRef{&c, &pool.file, k}});
    Prepared& p = prep[size_t(i)];
    p.target = pr.target(doc, at);
    if (multiple_input) {
      // (labeled examples + each context, target_delimiter + the shared
      // continuation); the gold is doc_to_text's index.
      const Json q = pr.text(doc, at);
      if (!q.is_number_integer())
        at.fail_field("doc_to_text",
                      fmt::format("{} is not a context's index (the task is multiple-input: "
                                  "document 0's is one)",
                                  q.dump()));
      p.context = pr.labeled_examples(doc, at, shots);
      p.choices = pr.choices(doc, at);
      p.gold.push_back(choice_index(q, p.choices, at, "doc_to_text"));
      const std::string cont = pr.choice_delimiter() + as_text(p.target);
      p.first = ll_reqs.size();
      for (const std::string& ctx : p.choices) {
        ll_reqs.push_back({p.context + ctx, cont});
        p.arguments.push_back({p.context + ctx, cont});
      }
      p.count = p.choices.size();
      continue;
    }
    p.context = c.output_type == "loglikelihood_rolling" ? "" : pr.context(doc, at, shots);
    if (c.output_type == "multiple_choice") {
      p.choices = pr.choices(doc, at);
      if (p.target.is_array()) {
        for (const Json& t : p.target) p.gold.push_back(choice_index(t, p.choices, at));
      } else {
        p.gold.push_back(choice_index(p.target, p.choices, at));
      }
      p.first = ll_reqs.size();
      for (const std::string& ch : p.choices) {
        ll_reqs.push_back({p.context, pr.choice_delimiter() + ch});
        p.arguments.push_back({p.context, pr.choice_delimiter() + ch});
      }
      p.count = p.choices.size();
      // acc_mutual_info also needs each choice's unconditional log-likelihood
      // (an empty context), asked right after the conditional ones.
      if (mutual_info)
        for (const std::string& ch : p.choices) {
          ll_reqs.push_back({"", pr.choice_delimiter() + ch});
          p.arguments.push_back({"", pr.choice_delimiter() + ch});
        }
    } else if (c.output_type == "loglikelihood") {
      const std::string t = pr.answer(doc, p.target, at);
      p.first = ll_reqs.size();
      p.count = 1;
      ll_reqs.push_back({p.context, t});
      p.arguments.push_back({p.context, t});
    } else if (c.output_type == "loglikelihood_rolling") {
      if (!p.target.is_string())
        at.fail_field("doc_to_target", fmt::format("{} is not text to score", p.target.dump()));
      p.first = rolling.size();
      p.count = 1;
      rolling.push_back(p.target.get<std::string>());
      p.arguments.push_back(Json::array({p.target}));
    } else {
      if (c.has_choices()) {
        p.choices = pr.choices(doc, at);
        p.gold_texts.push_back(p.choices[size_t(choice_index(p.target, p.choices, at))]);
      } else if (p.target.is_array()) {
        for (const Json& t : p.target) p.gold_texts.push_back(as_text(t));
      } else {
        p.gold_texts.push_back(as_text(p.target));
      }
      // `repeats` answers a document, at texts[first, first + repeats);
      // sampled, answer j of document i draws with seed + i x repeats + j.
      p.first = gens.size() * size_t(c.repeats);
      p.count = size_t(c.repeats);
      GenerateRequest g{p.context, c.until, c.max_gen_toks, c.repeats};
      Json kwargs{{"until", c.until}, {"max_gen_toks", c.max_gen_toks}, {"do_sample", c.do_sample}};
      if (c.do_sample) {
        g.sample = true;
        g.temperature = c.temperature, g.top_p = c.top_p, g.top_k = c.top_k;
        g.seed = opt.seed + uint64_t(i) * uint64_t(c.repeats);
        kwargs["temperature"] = c.temperature;
        if (c.top_p < 1) kwargs["top_p"] = c.top_p;
        if (c.top_k > 0) kwargs["top_k"] = c.top_k;
      }
      gens.push_back(std::move(g));
      p.arguments.push_back({p.context, kwargs});
    }
  }

  std::vector<LoglikelihoodResult> lls;
  std::vector<double> rolled;
  std::vector<std::string> texts;
  if (!ll_reqs.empty()) lls = model.loglikelihood(ll_reqs);
  if (!rolling.empty()) rolled = model.loglikelihood_rolling(rolling);
  if (!gens.empty()) texts = model.generate_until(gens);

  // items[filter][metric]: per-document values, or (loglik, units) pairs.
  const size_t F = c.filters.size(), M = c.metrics.size();
  std::vector<std::vector<std::vector<double>>> items(F, std::vector<std::vector<double>>(M));
  std::vector<std::vector<std::vector<std::pair<double, double>>>> pairs(
      F, std::vector<std::vector<std::pair<double, double>>>(M));
  for (int64_t i = 0; i < n; ++i) {
    const Prepared& p = prep[size_t(i)];
    Json resps = Json::array(), filtered = Json::object();
    for (size_t f = 0; f < F; ++f) {
      std::string answer;
      if (c.output_type == "generate_until") {
        const auto from = texts.begin() + std::ptrdiff_t(p.first);
        answer = apply_filter(c.filters[f], {from, from + std::ptrdiff_t(p.count)}).at(0);
        filtered[c.filters[f].name] = answer;
      }
      for (size_t m = 0; m < M; ++m) {
        const std::string& name = c.metrics[m].metric;
        if (c.output_type == "multiple_choice") {
          std::vector<double> ll(p.count);
          for (size_t k = 0; k < p.count; ++k) ll[k] = lls[p.first + k].logprob;
          auto argmax = [&](auto&& norm) {
            size_t best = 0;
            for (size_t k = 1; k < p.count; ++k)
              if (ll[k] / norm(k) > ll[best] / norm(best)) best = k;
            return int64_t(best);
          };
          int64_t pred = 0;
          if (name == "acc") pred = argmax([](size_t) { return 1.0; });
          if (name == "acc_norm")
            pred = argmax([&](size_t k) { return double(code_points(p.choices[k])); });
          if (name == "acc_bytes")
            pred = argmax([&](size_t k) { return double(p.choices[k].size()); });
          if (name == "acc_mutual_info") {
            std::vector<double> mi(p.count);
            for (size_t k = 0; k < p.count; ++k) mi[k] = ll[k] - lls[p.first + p.count + k].logprob;
            pred = std::max_element(mi.begin(), mi.end()) - mi.begin();
          }
          items[f][m].push_back(
              std::find(p.gold.begin(), p.gold.end(), pred) != p.gold.end() ? 1.0 : 0.0);
        } else if (c.output_type == "loglikelihood") {
          const LoglikelihoodResult& r = lls[p.first];
          items[f][m].push_back(name == "perplexity" ? r.logprob : (r.greedy ? 1.0 : 0.0));
        } else if (c.output_type == "loglikelihood_rolling") {
          const std::string& t = rolling[p.first];
          const double units =
              name == "word_perplexity" ? double(count_words(t)) : double(t.size());
          pairs[f][m].push_back({rolled[p.first], units});
        } else {
          double score = 0;
          for (const std::string& g : p.gold_texts)
            score = std::max(score, exact_match(answer, g, c.metrics[m]));
          items[f][m].push_back(score);
        }
      }
    }
    if (i < opt.write_out) {
      if (c.output_type == "multiple_choice" || c.output_type == "loglikelihood")
        for (size_t k = 0; k < p.arguments.size(); ++k)
          resps.push_back({lls[p.first + k].logprob, lls[p.first + k].greedy});
      else if (c.output_type == "loglikelihood_rolling")
        resps.push_back(rolled[p.first]);
      else
        for (size_t k = 0; k < p.count; ++k) resps.push_back(texts[p.first + k]);
      Json s;
      s["doc_id"] = i;
      s["doc"] = docs.docs[size_t(i)];
      s["target"] = p.target;
      s["arguments"] = p.arguments;
      s["resps"] = resps;
      if (!filtered.empty()) s["filtered_resps"] = filtered;
      res.samples.push_back(std::move(s));
    }
  }

  for (size_t f = 0; f < F; ++f)
    for (size_t m = 0; m < M; ++m) {
      const MetricSpec& ms = c.metrics[m];
      MetricValue v;
      v.key = ms.metric + "," + c.filters[f].name;
      v.higher_is_better = ms.higher_is_better;
      const bool se = opt.bootstrap_iters > 0 && items[f][m].size() > 1;
      if (ms.aggregation == "mean") {
        v.value = mean(items[f][m]);
        if (se) v.stderr_ = mean_stderr(items[f][m]);
      } else if (ms.aggregation == "perplexity") {
        v.value = perplexity(items[f][m]);
        if (se) v.stderr_ = bootstrap_stderr(perplexity, items[f][m], opt.bootstrap_iters);
      } else if (ms.aggregation == "weighted_perplexity") {
        v.value = weighted_perplexity(pairs[f][m]);
      } else {
        v.value = bits_per_byte(pairs[f][m]);
      }
      res.metrics.push_back(std::move(v));
    }
  return res;
}

}  // namespace nk
