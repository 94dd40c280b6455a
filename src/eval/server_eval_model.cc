#include "eval/server_eval_model.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "eval/py_text.h"

namespace nk {

using json = nlohmann::json;

namespace {

std::string completions_endpoint(std::string url) {
  while (url.ends_with("/")) url.pop_back();
  if (!url.ends_with("/v1")) url += "/v1";
  return url + "/completions";
}

std::string head_of(const std::string& s) {
  return s.size() > 300 ? s.substr(0, 300) + "..." : s;
}

}  // namespace

ServerEvalModel::ServerEvalModel(const std::string& url, int64_t batch_size,
                                 std::chrono::milliseconds timeout, std::string prefix_text,
                                 std::string model_name)
    : endpoint_(completions_endpoint(url)),
      url_(parse_http_url("eval.model", endpoint_)),
      batch_(batch_size),
      timeout_(timeout),
      prefix_text_(std::move(prefix_text)),
      model_name_(std::move(model_name)) {
  if (batch_ < 1) fail("eval.batch_size: must be >= 1, got {}", batch_);
}

const std::string& ServerEvalModel::context_or_prefix(const std::string& context) const {
  if (!context.empty()) return context;
  if (prefix_text_.empty())
    fail(
        "eval.model '{}': a request with an empty context (loglikelihood_rolling, "
        "acc_mutual_info, an empty prompt) needs eval.prefix_text: the text of the model's "
        "end-of-text (or BOS) token, e.g. <|endoftext|>, which the server encodes as that token",
        endpoint_);
  return prefix_text_;
}

std::vector<json> ServerEvalModel::complete(json body, size_t prompts) {
  if (!model_name_.empty()) body["model"] = model_name_;
  const std::string name = fmt::format("eval.model '{}'", endpoint_);
  HttpPostResult r;
  try {
    r = http_post_json(url_, body.dump(-1, ' ', false, json::error_handler_t::replace), timeout_);
  } catch (const Error& e) {
    fail("{}: {} (eval.timeout_s {} s)", name, e.what(), double(timeout_.count()) / 1000);
  }
  if (r.status != 200) fail("{}: HTTP status {} (body: '{}')", name, r.status, head_of(r.body));
  json j;
  try {
    j = json::parse(r.body);
  } catch (const json::exception&) {
    fail("{}: the body is not JSON: '{}'", name, head_of(r.body));
  }
  if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array())
    fail("{}: the body has no 'choices' list: '{}'", name, head_of(r.body));
  std::vector<json> out(prompts);
  for (const json& c : j["choices"]) {
    if (!c.is_object() || !c.contains("index") || !c["index"].is_number_integer())
      fail("{}: a choice without an integer 'index': '{}'", name, head_of(c.dump()));
    const int64_t i = c["index"].get<int64_t>();
    if (i < 0 || i >= int64_t(prompts) || !out[size_t(i)].is_null())
      fail("{}: choice index {} for {} prompts (or repeated)", name, i, prompts);
    out[size_t(i)] = c;
  }
  for (size_t i = 0; i < prompts; ++i)
    if (out[i].is_null()) fail("{}: no choice for prompt {} of {}", name, i, prompts);
  return out;
}

std::vector<LoglikelihoodResult> ServerEvalModel::score(
    const std::vector<std::pair<std::string, size_t>>& reqs) {
  const std::string name = fmt::format("eval.model '{}'", endpoint_);
  std::vector<LoglikelihoodResult> out;
  for (size_t at = 0; at < reqs.size(); at += size_t(batch_)) {
    const size_t end = std::min(reqs.size(), at + size_t(batch_));
    json prompts = json::array();
    for (size_t i = at; i < end; ++i) prompts.push_back(reqs[i].first);
    const std::vector<json> choices = complete({{"prompt", prompts},
                                                {"max_tokens", 0},
                                                {"echo", true},
                                                {"logprobs", 1},
                                                {"temperature", 0}},
                                               end - at);
    for (size_t i = at; i < end; ++i) {
      const json& c = choices[i - at];
      const std::string& prompt = reqs[i].first;
      const size_t ctx_bytes = reqs[i].second;
      const json lp = c.value("logprobs", json());
      auto list = [&](const char* key) -> const json& {
        if (!lp.is_object() || !lp.contains(key) || !lp[key].is_array())
          fail("{}: choice {} has no logprobs.{} list (does the server score echoed prompts?)",
               name, i - at, key);
        return lp[key];
      };
      const json &offs = list("text_offset"), &lps = list("token_logprobs"),
                 &tops = list("top_logprobs");
      const size_t n = offs.size();
      if (lps.size() != n || tops.size() != n)
        fail("{}: choice {}: logprobs lists of {}, {} and {} entries", name, i - at, n, lps.size(),
             tops.size());
      // The continuation: the tokens from the one that holds the context's
      // end byte on.
      size_t k0 = n;
      for (size_t k = 0; k < n; ++k) {
        const json& next = k + 1 < n ? offs[k + 1] : json(prompt.size());
        if (!next.is_number_unsigned() && !next.is_number_integer())
          fail("{}: choice {}: text_offset[{}] is not a number", name, i - at, k + 1);
        if (next.get<int64_t>() > int64_t(ctx_bytes)) {
          k0 = k;
          break;
        }
      }
      if (k0 == 0 && n > 0)
        fail(
            "{}: choice {}: the continuation starts at the prompt's first token, which has no "
            "log-probability",
            name, i - at);
      LoglikelihoodResult r;
      r.greedy = true;
      for (size_t k = k0; k < n; ++k) {
        if (!lps[k].is_number())
          fail("{}: choice {}: token_logprobs[{}] is {}, not a number", name, i - at, k,
               lps[k].dump());
        const double x = lps[k].get<double>();
        r.logprob += x;
        if (!tops[k].is_object())
          fail("{}: choice {}: top_logprobs[{}] is {}, not an object", name, i - at, k,
               tops[k].dump());
        for (const auto& [tok, v] : tops[k].items())
          if (v.is_number() && v.get<double>() > x) r.greedy = false;
      }
      out.push_back(r);
    }
  }
  return out;
}

std::vector<LoglikelihoodResult> ServerEvalModel::loglikelihood(
    const std::vector<LoglikelihoodRequest>& reqs) {
  std::vector<std::pair<std::string, size_t>> prompts;
  for (const auto& r : reqs) {
    // Python's rstrip(): trailing white space moves to the continuation.
    const std::string& context = context_or_prefix(r.context);
    const size_t keep = r.context.empty() ? context.size() : py_rstrip(context).size();
    prompts.push_back({context + r.continuation, keep});
  }
  return score(prompts);
}

std::vector<double> ServerEvalModel::loglikelihood_rolling(const std::vector<std::string>& texts) {
  std::vector<std::pair<std::string, size_t>> prompts;
  for (const std::string& t : texts) {
    const std::string& prefix = context_or_prefix("");
    prompts.push_back({prefix + t, prefix.size()});
  }
  std::vector<double> out;
  for (const LoglikelihoodResult& r : score(prompts)) out.push_back(r.logprob);
  return out;
}

std::vector<std::string> ServerEvalModel::generate_until(const std::vector<GenerateRequest>& reqs) {
  std::vector<std::vector<std::string>> answers(reqs.size());
  auto stops = [](const GenerateRequest& r) {
    std::vector<std::string> stop;
    for (const std::string& s : r.until)
      if (!s.empty()) stop.push_back(s);
    return stop;
  };
  // The choices' texts, each cut at the first until string as the harness
  // does after any server.
  auto texts = [&](const std::vector<json>& choices, const std::vector<std::string>& stop) {
    std::vector<std::string> out;
    for (size_t i = 0; i < choices.size(); ++i) {
      const json& c = choices[i];
      if (!c.contains("text") || !c["text"].is_string())
        fail("eval.model '{}': choice {} has no 'text' string", endpoint_, i);
      std::string text = c["text"].get<std::string>();
      for (const std::string& s : stop)
        if (const size_t p = text.find(s); p != std::string::npos) text.resize(p);
      out.push_back(std::move(text));
    }
    return out;
  };
  // A sampled request goes alone, its answers as the request's n choices
  // (the server seeds choice j with seed + j, as the local path does).
  // Greedy requests that share stop strings and length go together, batch_
  // prompts at a time, each answer given `repeats` times.
  std::map<std::pair<std::vector<std::string>, int64_t>, std::vector<size_t>> groups;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerateRequest& r = reqs[i];
    if (!r.sample) {
      groups[{stops(r), r.max_gen_toks}].push_back(i);
      continue;
    }
    json body = {{"prompt", json::array({context_or_prefix(r.context)})},
                 {"max_tokens", r.max_gen_toks},
                 {"temperature", r.temperature},
                 {"top_p", r.top_p},
                 {"n", r.repeats},
                 {"seed", r.seed}};
    if (r.top_k > 0) body["top_k"] = r.top_k;
    if (!stops(r).empty()) body["stop"] = stops(r);
    answers[i] = texts(complete(body, size_t(r.repeats)), stops(r));
  }
  for (const auto& [key, idx] : groups) {
    for (size_t at = 0; at < idx.size(); at += size_t(batch_)) {
      const size_t end = std::min(idx.size(), at + size_t(batch_));
      json prompts = json::array();
      for (size_t i = at; i < end; ++i) prompts.push_back(context_or_prefix(reqs[idx[i]].context));
      json body = {{"prompt", prompts}, {"max_tokens", key.second}, {"temperature", 0}};
      if (!key.first.empty()) body["stop"] = key.first;
      const std::vector<std::string> got = texts(complete(body, end - at), key.first);
      for (size_t i = at; i < end; ++i)
        answers[idx[i]].assign(size_t(reqs[idx[i]].repeats), got[i - at]);
    }
  }
  std::vector<std::string> out;
  for (auto& a : answers) out.insert(out.end(), a.begin(), a.end());
  return out;
}

}  // namespace nk
