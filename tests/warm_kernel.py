"""Notebook kernels started as forks of a Python that has imported torch, torch._dynamo and numpy.

A notebook's execution starts a kernel (a Python that imports ipykernel, ~1 s), whose setup cell imports torch
(~1.5 s) and whose first optimizer imports torch._dynamo (~1.5 s): most of what the instructor's grading round
(tests/test_notebooks.py, 9 executions) costs. For that round only, jupyter finds the kernel spec "python3" in a
scratch JUPYTER_PATH (``kernel_environment``) whose command is this file: a client that asks the server for a
kernel and stands in for it. The kernel is ``python -m ipykernel_launcher -f CONNECTION_FILE`` run as
tests/warm_python.py runs a command, with the client's working directory, environment, stdout and stderr; the
client passes the signals jupyter sends (a cell timeout interrupts the kernel with SIGINT) on to it and exits
with its exit code; a client that is killed gets its kernel killed. The README's ``nbgrader validate`` keeps
jupyter's own kernel.

    python tests/warm_kernel.py serve SOCKET        # the server (``kernel_environment`` starts one)
    python tests/warm_kernel.py -f CONNECTION_FILE  # a kernel, as jupyter starts it
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

SOCKET_VARIABLE = "WARM_KERNEL_SOCKET"
# Not ipykernel: its classes read the kernel's environment (JPY_PARENT_PID) when it is imported
PRELOAD = ("torch", "torch._dynamo", "numpy")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def kernel_environment(scratch: Path) -> Iterator[dict]:
    """A running server, and the environment variables under which jupyter starts its kernels."""
    socket_path = scratch / "kernels.sock"
    spec = scratch / "jupyter" / "kernels" / "python3" / "kernel.json"
    spec.parent.mkdir(parents=True)
    spec.write_text(json.dumps({"argv": [sys.executable, __file__, "-f", "{connection_file}"],
                                "display_name": "Python 3", "language": "python", "interrupt_mode": "signal"}))
    env = dict(os.environ, OMP_NUM_THREADS="1")   # no thread pool in the server: forking it is safe
    server = subprocess.Popen([sys.executable, __file__, "serve", str(socket_path)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline() != "ready\n":
            raise RuntimeError(f"the warm kernel server did not start (exit {server.wait()})")
        yield {"JUPYTER_PATH": os.pathsep.join(filter(None, [str(spec.parents[2]), os.environ.get("JUPYTER_PATH")])),
               SOCKET_VARIABLE: str(socket_path)}
    finally:
        server.stdin.close()   # the server kills what kernels are left and exits
        server.wait(timeout=60)
        server.stdout.close()


# --- the client: what jupyter starts as the kernel -------------------------------------------------------

def stand_in(kernel_args: list[str]) -> int:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(os.environ[SOCKET_VARIABLE])
    own = f"/proc/{os.getpid()}/fd"
    job = {"args": ["-m", "ipykernel_launcher", *kernel_args], "cwd": os.getcwd(), "env": dict(os.environ),
           "stdout": f"{own}/1", "stderr": f"{own}/2", "append": True}
    connection.sendall((json.dumps(job) + "\n").encode())
    replies = connection.makefile("r")
    kernel = int(replies.readline())
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, lambda received, _frame: os.kill(kernel, received))
    exit_code = replies.readline()   # when the kernel has exited
    return int(exit_code) if exit_code else 1


# --- the server ------------------------------------------------------------------------------------------

def serve(socket_path: str) -> None:
    import warm_python   # beside this file: sys.path[0]
    for module in PRELOAD:
        importlib.import_module(module)
    site = warm_python.site_path()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen()
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ)
    events.register(sys.stdin, selectors.EVENT_READ)
    kernels: dict[int, socket.socket] = {}   # pid -> its client's connection
    print("ready", flush=True)
    running = True
    while running:
        for key, _ in events.select(timeout=0.05):
            if key.fileobj is listener:
                client, _ = listener.accept()
                job = json.loads(client.makefile("r").readline())
                pid = os.fork()
                if pid == 0:
                    for held in (events, listener, *kernels.values(), client):
                        held.close()
                    warm_python.become_the_command(job, site, default_threads=1)
                client.sendall(f"{pid}\n".encode())
                kernels[pid] = client
                events.register(client, selectors.EVENT_READ, pid)
            elif key.fileobj is sys.stdin:   # the test process is done (or gone)
                running = False
            elif not key.fileobj.recv(1):   # a client closed its connection before its kernel exited
                _kill(key.data)
        _reap(kernels, events)
    for pid in list(kernels):
        _kill(pid)
    while kernels:
        _reap(kernels, events, block=True)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _reap(kernels: dict, events: selectors.BaseSelector, block: bool = False) -> None:
    """Tell each exited kernel's client its exit code."""
    while kernels:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        if pid == 0:
            return
        client = kernels.pop(pid, None)
        if client is None:
            continue
        events.unregister(client)
        with contextlib.suppress(OSError):
            client.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        client.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(stand_in(sys.argv[1:]))
