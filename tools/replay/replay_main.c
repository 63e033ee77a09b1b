// SPDX-License-Identifier: MIT
// pkv-replay's entry point. The program is rt_replay_main (pkv_replay.c), a function
// so that the Python extension can run it too (python/src/sweep.c).
#include "replay_tools.h"

int main(int argc, char **argv) { return rt_replay_main(argc, argv); }
