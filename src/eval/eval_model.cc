#include "eval/eval_model.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "eval/py_text.h"
#include "infer/generate.h"
#include "infer/paged_cache.h"
#include "infer/sampler.h"
#include "ops/ops.h"

namespace nk {

LocalEvalModel::LocalEvalModel(Transformer& model, const Tokenizer& tok, int64_t batch_size,
                               std::vector<int32_t> end_ids, bool specials)
    : model_(model),
      tok_(tok),
      batch_(batch_size),
      max_len_(model.config().max_seq_len - model.config().prompt.virtual_tokens),
      vocab_(std::min(tok.vocab_size(), model.config().vocab_size)),
      end_ids_(std::move(end_ids)),
      specials_(specials) {
  if (batch_ < 1) fail("eval.batch_size: must be >= 1, got {}", batch_);
  if (model.config().prompt.virtual_tokens)
    fail("eval.model: a p-tuned model (virtual tokens) is not supported by eval tasks");
}

std::vector<int32_t> LocalEvalModel::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  if (specials_)
    tok_.encode_with_specials(text, ids);
  else
    tok_.encode(text, ids);
  return ids;
}

int32_t LocalEvalModel::prefix_token() const {
  return tok_.bos_id() >= 0 ? tok_.bos_id() : tok_.eod_id();
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> LocalEvalModel::encode_pair(
    const std::string& context, const std::string& cont) const {
  if (context.empty()) return {{prefix_token()}, encode(cont)};
  // Python's rstrip(): trailing white space moves to the continuation.
  const std::string ctx = py_rstrip(context);
  const size_t keep = ctx.size();
  const std::string whole = ctx + context.substr(keep) + cont;
  std::vector<int32_t> w = encode(whole), c = encode(ctx);
  const size_t n = std::min(c.size(), w.size());
  return {c, std::vector<int32_t>(w.begin() + int64_t(n), w.end())};
}

namespace {

// The most logits (f32) one scoring forward holds: 1 GiB.
constexpr int64_t kLogitCap = (int64_t(1) << 30) / int64_t(sizeof(float));

// Adds a continuation token's log-probability under one row of logits to
// res, and whether it is the row's argmax.
void add_token(LoglikelihoodResult& res, const float* row, int64_t vocab, int32_t id,
               std::vector<TokenLogprob>& top) {
  top.clear();
  res.logprob += raw_logprobs(row, vocab, id, 0, top);
  res.greedy = res.greedy && std::max_element(row, row + vocab) - row == id;
}

}  // namespace

std::vector<LoglikelihoodResult> LocalEvalModel::score_shared(
    const std::vector<TokenRequest>& reqs) {
  const int64_t V = model_.config().vocab_size, bs = 16;
  std::vector<LoglikelihoodResult> out(reqs.size());
  // Groups of requests with one context (the input before the row that
  // predicts the continuation's first token), longest first.
  std::map<std::vector<int32_t>, std::vector<size_t>> by_context;
  int64_t max_n = 1;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const TokenRequest& r = reqs[i];
    const int64_t n = int64_t(r.input.size()), k = int64_t(r.cont.size());
    NK_CHECK(k <= n, "eval: {} continuation tokens after an input of {}", k, n);
    out[i].greedy = true;
    if (k == 0) continue;
    max_n = std::max(max_n, n);
    by_context[std::vector<int32_t>(r.input.begin(), r.input.begin() + (n - k + 1))].push_back(i);
  }
  std::vector<std::pair<int64_t, const std::vector<size_t>*>> sized;  // longest input, group
  for (const auto& [ctx, g] : by_context) {
    int64_t n = 0;
    for (size_t i : g) n = std::max(n, int64_t(reqs[i].input.size()));
    sized.push_back({n, &g});
  }
  std::stable_sort(sized.begin(), sized.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<const std::vector<size_t>*> groups;
  for (const auto& s : sized) groups.push_back(s.second);
  // One cache for the call: a wave's sequences and its primed contexts,
  // whose full blocks stay in the prefix cache after they close.
  const int64_t per_seq = (max_n + bs - 1) / bs + 1;
  PagedCacheOptions o;
  o.block_size = bs;
  o.max_len = max_n;
  o.max_seqs = batch_;
  o.max_tokens = batch_ * max_n;
  o.blocks = 2 * batch_ * per_seq + 4;
  o.watermark = 0;
  PagedCache cache(model_.config(), model_.compute_dtype(), o, model_.device());
  StepBuffer step;
  std::vector<float> host;
  std::vector<TokenLogprob> top;
  shared_tokens_ = 0;
  for (size_t g = 0; g < groups.size();) {
    // A wave: whole groups up to batch_ requests (a larger group alone, in
    // parts).
    std::vector<size_t> wave;
    std::vector<const std::vector<size_t>*> primed;
    while (g < groups.size() &&
           (wave.empty() || int64_t(wave.size() + groups[g]->size()) <= batch_)) {
      const std::vector<size_t>& grp = *groups[g];
      if (grp.size() > 1) primed.push_back(&grp);
      wave.insert(wave.end(), grp.begin(), grp.end());
      ++g;
    }
    // Each shared context once, its full blocks then in the prefix cache.
    step.clear();
    std::vector<int32_t> handles;
    for (const std::vector<size_t>* grp : primed) {
      const TokenRequest& r = reqs[grp->front()];
      const int64_t c = int64_t(r.input.size() - r.cont.size()) + 1;
      if (c < bs || int64_t(handles.size()) == batch_) continue;
      const std::span<const int32_t> ids(r.input.data(), size_t(c));
      const SequenceCache::Opened op = cache.open(c, ids);
      if (op.handle == SequenceCache::kNoRoom) continue;
      NK_CHECK(cache.append(op.handle, op.cached, ids.subspan(size_t(op.cached)), step),
               "eval: no cache room for a context of {} tokens", c);
      handles.push_back(op.handle);
    }
    if (!step.tokens.empty()) {
      step.logit_rows = {int32_t(step.tokens.size() - 1)};
      cache.forward(model_, step, Tensor::empty({1, V}, DType::F32, model_.device()));
    }
    for (int32_t h : handles) cache.close(h);
    // Then every request over its context's cached blocks: its tail and
    // continuation computed, a logit row at each continuation token's; at
    // most batch_ requests a forward, and fewer when their logits would
    // pass 1 GiB (rolling windows' long continuations).
    for (size_t at = 0; at < wave.size();) {
      step.clear();
      handles.clear();
      std::vector<std::pair<size_t, int64_t>> rows;  // request, its first logit row
      size_t end = at;
      for (int64_t R = 0; end < wave.size() && int64_t(end - at) < batch_; ++end) {
        R += int64_t(reqs[wave[end]].cont.size());
        if (end > at && R > kLogitCap / V) break;
      }
      for (size_t j = at; j < end; ++j) {
        const TokenRequest& r = reqs[wave[j]];
        const int64_t n = int64_t(r.input.size()), k = int64_t(r.cont.size());
        const SequenceCache::Opened op =
            cache.open(n, std::span<const int32_t>(r.input.data(), size_t(n - k + 1)));
        NK_CHECK(op.handle != SequenceCache::kNoRoom && op.cached <= n - k,
                 "eval: no cache room for a request of {} tokens", n);
        shared_tokens_ += op.cached;
        const size_t base = step.tokens.size();
        NK_CHECK(cache.append(op.handle, op.cached,
                              std::span<const int32_t>(r.input).subspan(size_t(op.cached)), step),
                 "eval: no cache room for a request of {} tokens", n);
        rows.push_back({wave[j], int64_t(step.logit_rows.size())});
        for (int64_t i = 0; i < k; ++i)
          step.logit_rows.push_back(int32_t(base + size_t(n - k - op.cached + i)));
        handles.push_back(op.handle);
      }
      const int64_t R = int64_t(step.logit_rows.size());
      Tensor logits = Tensor::empty({R, V}, DType::F32, model_.device());
      cache.forward(model_, step, logits);
      host.resize(size_t(R * V));
      ops::copy_bytes_to_host(logits, host.data());
      for (const auto& [i, first] : rows)
        for (size_t t = 0; t < reqs[i].cont.size(); ++t)
          add_token(out[i], host.data() + (first + int64_t(t)) * V, vocab_, reqs[i].cont[t], top);
      for (int32_t h : handles) cache.close(h);
      at = end;
    }
  }
  return out;
}

std::vector<LoglikelihoodResult> LocalEvalModel::score(const std::vector<TokenRequest>& reqs) {
  if (share_prefixes_) return score_shared(reqs);
  const int64_t V = model_.config().vocab_size;
  std::vector<LoglikelihoodResult> out(reqs.size());
  std::vector<size_t> order(reqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return reqs[a].input.size() > reqs[b].input.size(); });
  std::vector<float> rows;
  std::vector<TokenLogprob> top;
  for (size_t at = 0; at < order.size();) {
    const int64_t T = std::max<int64_t>(1, int64_t(reqs[order[at]].input.size()));
    const int64_t fit = std::max<int64_t>(1, kLogitCap / (T * V));
    const int64_t B = std::min<int64_t>({batch_, fit, int64_t(order.size() - at)});
    std::vector<int32_t> x(size_t(B * T), 0);
    for (int64_t b = 0; b < B; ++b) {
      const auto& in = reqs[order[at + size_t(b)]].input;
      std::copy(in.begin(), in.end(), x.begin() + b * T);
    }
    Tensor xt = Tensor::empty({B, T}, DType::I32, model_.device());
    ops::copy_bytes_from_host(xt, x.data());
    Activations acts(model_, B, T, false);
    Tensor logits = Tensor::empty({B * T, V}, DType::F32, model_.device());
    model_.forward_all_logits(acts, xt, logits);
    rows.resize(size_t(B * T * V));
    ops::copy_bytes_to_host(logits, rows.data());
    for (int64_t b = 0; b < B; ++b) {
      const TokenRequest& r = reqs[order[at + size_t(b)]];
      LoglikelihoodResult& res = out[order[at + size_t(b)]];
      res.greedy = true;
      const int64_t n = int64_t(r.input.size()), k = int64_t(r.cont.size());
      for (int64_t i = 0; i < k; ++i)
        add_token(res, rows.data() + (b * T + n - k + i) * V, vocab_, r.cont[size_t(i)], top);
    }
    at += size_t(B);
  }
  return out;
}

std::vector<LoglikelihoodResult> LocalEvalModel::loglikelihood(
    const std::vector<LoglikelihoodRequest>& reqs) {
  std::vector<TokenRequest> toks;
  for (const auto& r : reqs) {
    auto [ctx, cont] = encode_pair(r.context, r.continuation);
    std::vector<int32_t> whole = ctx;
    whole.insert(whole.end(), cont.begin(), cont.end());
    if (int64_t(whole.size()) > max_len_ + 1)
      whole.erase(whole.begin(), whole.end() - (max_len_ + 1));
    if (int64_t(cont.size()) > int64_t(whole.size()) - 1)
      fail("eval: a continuation of {} tokens does not fit the model's context of {}", cont.size(),
           max_len_);
    whole.pop_back();
    toks.push_back({std::move(whole), std::move(cont)});
  }
  return score(toks);
}

std::vector<double> LocalEvalModel::loglikelihood_rolling(const std::vector<std::string>& texts) {
  // The harness's windows (context_len 1): the first predicts tokens [0, m)
  // from the prefix token and tokens [0, m-1); each next one predicts up to
  // max_len further tokens from the max_len tokens before its last target.
  std::vector<TokenRequest> windows;
  std::vector<size_t> owner;
  const int64_t L = max_len_;
  for (size_t t = 0; t < texts.size(); ++t) {
    const std::vector<int32_t> ids = tok_.encode(texts[t]);
    const int64_t n = int64_t(ids.size());
    if (n == 0) continue;
    const int64_t first = std::min(L, n);
    TokenRequest w;
    w.input.push_back(prefix_token());
    w.input.insert(w.input.end(), ids.begin(), ids.begin() + first - 1);
    w.cont.assign(ids.begin(), ids.begin() + first);
    windows.push_back(std::move(w));
    owner.push_back(t);
    for (int64_t done = first; done < n;) {
      const int64_t len = std::min(n - done, L), end = done + len;
      TokenRequest r;
      r.input.assign(ids.begin() + (end - L - 1), ids.begin() + (end - 1));
      r.cont.assign(ids.begin() + done, ids.begin() + end);
      windows.push_back(std::move(r));
      owner.push_back(t);
      done = end;
    }
  }
  const std::vector<LoglikelihoodResult> s = score(windows);
  std::vector<double> out(texts.size(), 0.0);
  for (size_t i = 0; i < s.size(); ++i) out[owner[i]] += s[i].logprob;
  return out;
}

std::vector<std::string> LocalEvalModel::generate_until(const std::vector<GenerateRequest>& reqs) {
  // A sampled request is `repeats` sequences (seeds seed + j), a greedy one
  // one sequence whose answer is repeated.
  std::vector<GenerationRequest> gens;
  for (const auto& r : reqs) {
    GenerationRequest g;
    g.prompt = r.context.empty() ? std::vector<int32_t>{prefix_token()} : encode(r.context);
    // HFLM keeps the context's last max_length - max_gen_toks tokens.
    const int64_t room = std::max<int64_t>(1, max_len_ - r.max_gen_toks);
    if (int64_t(g.prompt.size()) > room) g.prompt.erase(g.prompt.begin(), g.prompt.end() - room);
    g.max_new_tokens = std::min(r.max_gen_toks, max_len_ - int64_t(g.prompt.size()));
    for (const auto& s : r.until)
      if (!s.empty()) g.stop.push_back(s);
    g.sampling.temperature = r.sample ? r.temperature : 0;
    g.sampling.top_p = r.top_p;
    g.sampling.top_k = r.top_k;
    for (int64_t j = 0; j < (r.sample ? r.repeats : 1); ++j) {
      g.sampling.seed = r.seed + uint64_t(j);
      gens.push_back(g);
    }
  }
  Generator gen(model_, &tok_, batch_);
  gen.set_end_ids(end_ids_);
  std::vector<GenerationResult> done = gen.run(gens);
  std::vector<std::string> out;
  size_t at = 0;
  for (const auto& r : reqs)
    if (r.sample) {
      for (int64_t j = 0; j < r.repeats; ++j) out.push_back(std::move(done[at++].text));
    } else {
      out.insert(out.end(), size_t(r.repeats), done[at++].text);
    }
  return out;
}

}  // namespace nk
