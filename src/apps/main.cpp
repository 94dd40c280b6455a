#include "apps/cli.h"

int main(int argc, char** argv) {
  return nk::run_cli(argc, argv);
}
