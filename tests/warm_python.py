"""``python ...`` commands run in a fork of a Python that has already imported torch.

Starting Python and importing torch takes ~2 s, most of a documented command's run (nbgrader's ~2.5 s), and
the first optimizer a process builds imports torch._dynamo (~1.5 s more). A server process (one per test
process and set of modules) imports torch, torch._dynamo and numpy (or nbgrader) once, then forks a child per
command. The child becomes what ``python ARGS`` would be: the command's working directory, environment, argv,
``sys.path`` (the script's folder, the working directory for ``-m`` or '' for ``-c``, then the command's
PYTHONPATH, then the interpreter's site folders), torch's thread count from OMP_NUM_THREADS (or torch's
default), stdout/stderr captured apart, the exit code of SystemExit or 1 with the traceback for an uncaught
exception, the exit handlers run. The course's modules are imported fresh in each child, from the
child's ``sys.path``: a wrong path or a missing import fails here as it fails for a student.

Only a plain ``[VAR=value ...] python (SCRIPT | -m MODULE | -c CODE) [ARGS]`` line goes to the server; a line
with shell operators, another program or a Python option runs under bash as before.
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import shlex
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Optional

_SERVER_LOCK = threading.Lock()
_servers: dict[tuple[str, ...], subprocess.Popen] = {}   # by the modules each imported before serving
# torch._dynamo: torch imports it on the first optimizer a process builds (~1.5 s, torch/_compile.py), which every
# training command does
TORCH = ("torch", "torch._dynamo", "numpy")


def python_args(command: str) -> Optional[tuple[dict, list[str]]]:
    """(environment additions, the arguments after ``python``) of a plain python command line, else None."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    if any(token and set(token) <= set("();<>|&") for token in tokens):
        return None
    env = {}
    while tokens and "=" in tokens[0] and tokens[0].split("=")[0].isidentifier():
        name, value = tokens.pop(0).split("=", 1)
        env[name] = value
    if len(tokens) < 2 or tokens[0] != "python" or any(c in command for c in "$`\\*?"):
        return None
    args = tokens[1:]
    if args[0] in ("-m", "-c") and len(args) >= 2 or not args[0].startswith("-"):
        return env, args
    return None


def run(args: list[str], *, cwd: Path, env: dict, timeout: float,
        preload: tuple[str, ...] = TORCH) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd`` with ``env``, run by the warm server that imported ``preload`` (third-party
    modules only: the command's own are imported fresh); stdout and stderr as text."""
    with tempfile.TemporaryDirectory(prefix="warm-python-") as scratch:
        out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
        job = {"args": args, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        with _SERVER_LOCK:
            server = _started(preload)
            server.stdin.write(json.dumps(job) + "\n")
            server.stdin.flush()
            reply = server.stdout.readline()
        if not reply:
            raise RuntimeError(f"the warm python server died (exit {server.wait()}; its traceback is on this "
                               "process's stderr)")
        code = json.loads(reply)
        return subprocess.CompletedProcess(["python", *args], code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _started(preload: tuple[str, ...]) -> subprocess.Popen:
    server = _servers.get(preload)
    if server is None or server.poll() is not None:
        import torch
        env = dict(os.environ, OMP_NUM_THREADS="1")   # no thread pool in the server: forking it is safe
        server = _servers[preload] = subprocess.Popen(
            [sys.executable, __file__, str(torch.get_num_threads()), *preload], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        atexit.register(_stop, server)
    return server


def _stop(server: subprocess.Popen) -> None:
    server.stdin.close()   # the server's loop ends at end of input
    server.wait(timeout=60)
    server.stdout.close()


# --- the server ------------------------------------------------------------------------------------

def site_path() -> list[str]:
    """The interpreter's own entries of sys.path (not the script's folder, not PYTHONPATH's)."""
    own_pythonpath = _pythonpath(os.environ)
    return [entry for entry in sys.path[1:] if entry not in own_pythonpath]


def _serve(default_threads: int, preload: list[str]) -> None:
    for module in preload:   # imported once here, inherited by every child
        importlib.import_module(module)
    requests, replies = sys.stdin, sys.stdout
    site = site_path()
    for line in requests:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            become_the_command(job, site, default_threads)
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
        replies.flush()


def _pythonpath(env) -> list[str]:
    return [os.path.abspath(entry) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


def become_the_command(job: dict, site_path: list[str], default_threads: int) -> None:
    """In a forked child: run ``python job["args"]`` as described above, then exit. Its stdout and stderr go to
    the files job["stdout"] and job["stderr"], appended to with job["append"] (another process's open file),
    else written anew."""
    code = 1
    try:
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        mode = os.O_WRONLY | (os.O_APPEND if job.get("append") else os.O_CREAT | os.O_TRUNC)
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            target = os.open(path, mode)
            os.dup2(target, fd)
            os.close(target)
        torch = sys.modules.get("torch")   # started here: what OMP_NUM_THREADS would have made it
        if torch is not None:
            omp = job["env"].get("OMP_NUM_THREADS", "").split(",")[0].strip()
            torch.set_num_threads(int(omp) if omp.isdigit() and int(omp) > 0 else default_threads)
        code = _run_main(job["args"], _pythonpath(job["env"]) + site_path)   # PYTHONPATH read in job["cwd"]
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:   # noqa: B036 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _run_main(args: list[str], path: list[str]) -> int:
    try:
        if args[0] == "-m":
            sys.argv = ["-m", *args[2:]]
            sys.path[:] = [os.getcwd(), *path]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[:] = ["", *path]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(args)
            sys.path[:] = [os.path.dirname(os.path.realpath(args[0])), *path]
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:   # noqa: B036
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2:])
