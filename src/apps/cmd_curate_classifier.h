// `nekton curate train-classifier`: trains a fastText classifier for the
// `classifier` curation stage. The `curate` command dispatches to it.
#pragma once
#include <string>
#include <vector>

namespace nk {

// args: "train-classifier" (optional, skipped) and then the options; see
// --help. Returns 0 on success; nk::Error for bad options or input.
int cmd_curate_train_classifier(const std::vector<std::string>& args);

}  // namespace nk
