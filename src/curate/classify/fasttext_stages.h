// The fastText stages of a curation pipeline (registered by
// register_fasttext_stages in stages.h):
//
//   - type: language_id        labels each document with fastText's lid.176
//     model: PATH              default: lid.176.ftz from the fetched assets
//     min_score: 0.3           remove documents whose top language scores less
//     languages: [en, de]      keep only these (ISO codes); empty: keep any
//
//   - type: classifier         scores documents with a trained fastText model
//     model: PATH              required (`nekton curate train-classifier`)
//     label: hq                the positive label ("__label__" prefix optional)
//     mode: threshold          threshold: keep if score >= threshold
//     threshold: 0.5           pareto: keep if a Pareto(alpha) draw > 1 - score
//     alpha: 3                 (pareto only) as NeMo Curator's quality filter
//     seed: 42                 (pareto only) with the document id, seeds its draw
//     score_key: quality_score meta key the score is written to
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace nk::curate {

// Where the set-up puts fastText's language id model: under assets_dir().
std::string default_langid_model_path();

// The default `min_score` of language_id: NeMo Curator's min_langid_score.
inline constexpr double kDefaultMinLangScore = 0.3;

// A Pareto (Lomax, as numpy.random.pareto) draw with shape `alpha`, fixed by
// the document id and the seed alone: P(draw > x) = (1 + x)^-alpha.
double pareto_draw(std::string_view doc_id, uint64_t seed, double alpha);

}  // namespace nk::curate
