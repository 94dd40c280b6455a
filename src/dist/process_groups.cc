#include "dist/process_groups.h"

#include <fmt/ranges.h>

namespace nk::dist {

void ProcessGroups::add(std::unique_ptr<Communicator> comm) {
  std::string name = comm->name();
  comms_[name] = std::move(comm);
}

Communicator& ProcessGroups::get(const std::string& name) const {
  auto it = comms_.find(name);
  if (it != comms_.end()) return *it->second;
  fail("this rank is not in process group '{}' (its groups: {})", name, fmt::join(names(), ", "));
}

std::vector<std::string> ProcessGroups::names() const {
  std::vector<std::string> out;
  for (auto& [n, c] : comms_) out.push_back(n);
  return out;
}

void ProcessGroups::set_timeout(double seconds) {
  for (auto& [n, c] : comms_) c->set_timeout(seconds);
}

}  // namespace nk::dist
