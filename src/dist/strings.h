// Byte strings between the ranks of a group: every rank's string to every
// rank (the curation stages' per-document records, the trainer's per-rank
// profile tables), over the group's Communicator, so with its timeout: a
// rank that died is an error naming it, never a wait forever. The strings
// live in host memory: a host (MPI) communicator's buffers.
#pragma once
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace nk::dist {

// send[j] (one per rank of `comm`) goes to rank j; returns what each rank
// sent to this one, by rank. Strings of any length, empty included.
std::vector<std::string> exchange_strings(Communicator& comm, const std::vector<std::string>& send);

// Every rank's `mine`, by rank.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

}  // namespace nk::dist
