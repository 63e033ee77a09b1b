// SPDX-License-Identifier: MIT
// An output file of a tool, written whole or not at all (issue 20, defect 3).
// A regular file (or a new one) is written to a temporary file in the same
// folder and renamed over the target only when every write, the flush and the
// close succeeded: a failed write never leaves a truncated report under the
// final name. A target that exists and is not a regular file (/dev/stdout, a
// FIFO, /dev/full) is written in place, and so is one in a folder where no new
// file can be made (the target's own error then names the problem); "-" is
// stdout. Every failure is
// reported on stderr as "PROG: cannot write FILE: <reason>".
#ifndef PKV_TOOLS_OUT_FILE_H
#define PKV_TOOLS_OUT_FILE_H

#include <stdio.h>

typedef struct out_file {
    FILE *f;          // write here between out_open and out_close
    const char *prog; // "pkv-replay", for messages (borrowed)
    const char *path; // the name the user gave (borrowed)
    char *target;     // the file renamed over (owned; NULL when written in place)
    char *tmp;        // the temporary file (owned; NULL when written in place)
} out_file;

// Open `path` for writing. 0 on success; -1 after the message.
int out_open(out_file *o, const char *prog, const char *path);
// Flush, close and rename; 0 on success. -1 after the message, and the
// temporary file removed (the target keeps what it held).
int out_close(out_file *o);
// Check that everything written to stdout reached it (at exit); -1 after the
// message "PROG: cannot write stdout: <reason>".
int out_check_stdout(const char *prog);

#endif // PKV_TOOLS_OUT_FILE_H
