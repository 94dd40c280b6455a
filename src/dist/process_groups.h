// ProcessGroups: this rank's communicators, one per Mesh group it belongs to,
// by the group's name ("tp", "dp-cp", "world", ...). Made by a backend's runtime
// (MpiRuntime::make_groups) and passed, with the Mesh, to what communicates.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace nk::dist {

class ProcessGroups {
 public:
  void add(std::unique_ptr<Communicator> comm);
  // Throws nk::Error naming the groups this rank has when it is not in `name`.
  Communicator& get(const std::string& name) const;
  bool has(const std::string& name) const { return comms_.count(name) > 0; }
  // The groups of this rank, sorted by name.
  std::vector<std::string> names() const;
  // Sets every communicator's timeout (seconds).
  void set_timeout(double seconds);

 private:
  std::map<std::string, std::unique_ptr<Communicator>> comms_;
};

}  // namespace nk::dist
