// lm-evaluation-harness's per-document metric functions, filters and
// aggregations (lm_eval/api/metrics.py, lm_eval/filters), with its closed-form
// standard error of a mean: sqrt(Σ(x - mean)² / (n - 1)) / sqrt(n).
// Regular expressions are Python's `re` patterns run by PCRE2 (the same on
// the patterns task files use: classes, groups, anchors, alternation).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "eval/task_config.h"

namespace nk {

// exact_match_hf_evaluate on one pair: regexes_to_ignore removed (re.sub),
// then lower-cased, then string.punctuation, then digits removed, as asked;
// 1 if equal else 0.
double exact_match(std::string prediction, std::string reference, const MetricSpec& m);

// A filter pipeline over one document's responses (regex: re.findall's
// match at group_select, the first non-empty group of a multi-group match,
// stripped, else the fallback; take_first: the first response only;
// take_first_k: the first k; majority_vote: the most frequent response,
// ties to the first seen, as Counter.most_common(1)).
std::vector<std::string> apply_filter(const FilterSpec& f, std::vector<std::string> responses);

// re.findall(pattern, text) as Python returns it: whole matches without
// groups, group 1 with one, every group (unmatched as "") with more.
std::vector<std::vector<std::string>> regex_findall(const std::string& pattern,
                                                    const std::string& text);
// re.sub(pattern, replacement, text) with a literal replacement.
std::string regex_remove(const std::string& pattern, const std::string& text);

double mean(const std::vector<double>& x);
// nullopt for fewer than 2 items (the harness writes "N/A").
std::optional<double> mean_stderr(const std::vector<double>& x);
// exp(-mean(loglikelihoods))
double perplexity(const std::vector<double>& ll);
// The harness's bootstrap standard error of f(xs) (what it reports for
// perplexity): iters / 1000 chunks (chunk = min(1000, iters)), chunk i drawing
// with Python's random.Random(i) `chunk` resamples rnd.choices(xs, k=n),
// i.e. xs[floor(random() * n)] n times; the sample standard deviation of
// f over all resamples in chunk order. nullopt for fewer than 2 resamples.
std::optional<double> bootstrap_stderr(const std::function<double(const std::vector<double>&)>& f,
                                       const std::vector<double>& xs, int64_t iters);
// exp(-Σ ll / Σ units); bits_per_byte: -Σ ll / Σ bytes / ln 2.
double weighted_perplexity(const std::vector<std::pair<double, double>>& items);
double bits_per_byte(const std::vector<std::pair<double, double>>& items);

}  // namespace nk
