// SPDX-License-Identifier: MIT
// Stand-in for the CUDA header of this name: the CPU emulator (../pkvemu.h).
#include "../pkvemu.h"
