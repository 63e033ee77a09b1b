// SPDX-License-Identifier: MIT
// pkv-replay inside the extension, for pagedkv.sweep (python/pagedkv/_sweep.py): runs
// the command-line tool's own entry point (rt_replay_main, tools/replay/pkv_replay.c, built
// into this module) on an argument list and returns its exit code, stdout and stderr.
// A point of a Python sweep and the merge of its shards thus go through exactly the C
// code of `pkv-replay --point K/N` and `pkv-replay merge`, and print the same bytes.
//
// The tool runs in a forked child: it owns process-wide state that the Python process
// must keep to itself (a SIGINT handler and the stop flag it sets, file descriptors 1
// and 2). The child runs C only (no Python) and ends with _exit. POSIX promises only
// async-signal-safe calls after fork in a threaded process; glibc's fork handlers keep
// malloc and stdio usable in the child, and the tool takes no lock that a thread of
// this process could hold (Linux is what this targets). The caller waits with
// the GIL released, so threads of the interpreter (a Dask worker's heartbeat) go on and
// several points run at once from a thread pool.
#include "pkvpy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "replay_tools.h"

// Reads all of f from the start into a new bytes object.
static PyObject *slurp(FILE *f) {
    if (fseek(f, 0, SEEK_END) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *b = PyBytes_FromStringAndSize(NULL, n);
    if (!b)
        return NULL;
    if (n && fread(PyBytes_AS_STRING(b), 1, (size_t)n, f) != (size_t)n) {
        Py_DECREF(b);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return b;
}

// Child side: fds 1 and 2 to the capture files, run the tool, flush, leave.
static _Noreturn void run_child(int out_fd, int err_fd, int argc, char **argv) {
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0)
        _exit(127);
    int rc = rt_replay_main(argc, argv);
    fflush(NULL);
    _exit(rc & 0xff);
}

// _replay_cli(args: list of str) -> (exit code, stdout bytes, stderr bytes).
// args[0] is the program name, as in argv. A child killed by signal S gives 128 + S.
static PyObject *replay_cli(PyObject *m, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "_replay_cli: args must be a list of str");
    if (!seq)
        return NULL;
    const Py_ssize_t argc = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = NULL;
    PyObject **encoded = PyMem_Calloc((size_t)argc + 1, sizeof *encoded);
    char **argv = PyMem_Calloc((size_t)argc + 1, sizeof *argv);
    FILE *out = NULL, *err = NULL;
    if (!encoded || !argv) {
        PyErr_NoMemory();
        goto done;
    }
    if (argc < 1) {
        pkvpy_raise(PKV_ERR_INVALID_ARG, "_replay_cli", "args needs the program name first");
        goto done;
    }
    for (Py_ssize_t i = 0; i < argc; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &encoded[i]))
            goto done;
        argv[i] = PyBytes_AS_STRING(encoded[i]);
    }
    out = tmpfile();
    err = tmpfile();
    if (!out || !err) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    // Whatever this process buffered would otherwise be written twice (here and by
    // the child's fflush).
    fflush(stdout);
    fflush(stderr);
    pid_t pid;
    int status = 0, wait_errno = 0;
    Py_BEGIN_ALLOW_THREADS
    pid = fork();
    if (pid == 0)
        run_child(fileno(out), fileno(err), (int)argc, argv);
    if (pid > 0) {
        while (waitpid(pid, &status, 0) < 0) {
            if (errno != EINTR) {
                wait_errno = errno;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (pid < 0 || wait_errno) {
        errno = pid < 0 ? errno : wait_errno;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status)
                   : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    PyObject *o = slurp(out), *e = o ? slurp(err) : NULL;
    if (o && e)
        result = Py_BuildValue("(iNN)", rc, o, e);
    else {
        Py_XDECREF(o);
        Py_XDECREF(e);
    }
done:
    if (out)
        fclose(out);
    if (err)
        fclose(err);
    for (Py_ssize_t i = 0; encoded && i < argc; i++)
        Py_XDECREF(encoded[i]);
    PyMem_Free(encoded);
    PyMem_Free(argv);
    Py_DECREF(seq);
    return result;
}

PyMethodDef pkvpy_sweep_functions[] = {
    {"_replay_cli", (PyCFunction)replay_cli, METH_O,
     "_replay_cli(args) -> (exit code, stdout, stderr): `pkv-replay args[1:]` in a child\n"
     "process, as the command line tool runs it (pagedkv.sweep uses it)."},
    {NULL, NULL, 0, NULL},
};
