#include "cli/launch_options.h"

#include <CLI/CLI.hpp>

namespace pipeforge::cli {

void addLaunchOptions(CLI::App* sub, train::RankLaunch& launch, std::string& split_dir, const LaunchHelp& help) {
  const std::string only = help.without_nproc_is_rank ? "with --nproc: " : "";
  sub->add_option("--nproc", launch.nproc, help.nproc);
  sub->add_option("--master-addr", launch.master_addr, only + "the address ranks meet at (default 127.0.0.1)");
  sub->add_option("--master-port", launch.master_port, only + "the rendezvous port (default: a free one)");
  sub->add_option("--split-dir", split_dir, "(set by the launcher) " + help.split_dir)->group("");
}

}  // namespace pipeforge::cli
