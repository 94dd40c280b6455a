// Words for the shape of a YAML value in messages, shared by every reader of
// YAML settings ("key 'k' expects int value, got a list").
#pragma once
#include <yaml-cpp/yaml.h>

namespace nk {

const char* yaml_node_kind(const YAML::Node& n);  // "a map", "a list", "no value", "a scalar"

}  // namespace nk
