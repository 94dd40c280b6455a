#pragma once
namespace nk {
int run_cli(int argc, char** argv);
}
