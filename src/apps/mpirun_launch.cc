#include "apps/mpirun_launch.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/stop_signal.h"

namespace nk {

std::vector<std::string> mpirun_placement(int nproc) {
  if (unsigned(nproc) > std::thread::hardware_concurrency())
    return {"--oversubscribe", "--map-by", "core", "--bind-to", "core:overload-allowed"};
  return {"--oversubscribe", "--bind-to", "none"};
}

std::vector<std::string> mpirun_command(int nproc, const std::string& exe,
                                        const std::vector<std::string>& args) {
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(nproc)};
  for (std::string& a : mpirun_placement(nproc)) cmd.push_back(std::move(a));
  cmd.push_back(exe);
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

void exec_mpirun(int nproc, const std::vector<std::string>& args) {
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) fail("--nproc: cannot find this executable's path: {}", ec.message());
  if (geteuid() == 0) {  // OpenMPI refuses root without these
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  std::vector<std::string> cmd = mpirun_command(nproc, exe, args);
  std::vector<char*> argv;
  for (std::string& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  unblock_stop_signals();  // mpirun must get SIGTERM/SIGINT as usual
  execvp(argv[0], argv.data());
  fail("--nproc {}: cannot start mpirun: {} (install OpenMPI, or launch with mpirun/srun yourself)",
       nproc, std::strerror(errno));
}

}  // namespace nk
