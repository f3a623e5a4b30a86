"""Run a mutant's test command without paying Python's start-up for every mutant.

cosmic-ray runs its test command once per mutant. Most of that command's time here is not the
tests: it is starting Python and importing torch, Triton, numpy, Hypothesis and pytest (about
3 s of a 4-7 s run). This module keeps one server process with those libraries imported and
forks it for every run, so a run costs its tests and the import of the project alone:

    python strength/forkserver.py serve --socket S          # once per session, in the background
    python strength/forkserver.py run --socket S -- ARGS    # the test command: pytest ARGS

`run` is a thin client (the Python interpreter with the standard library only): it sends its
working directory, ARGS and the run's time limit to the server, streams the child's output
to its own stdout and exits with the child's exit status, so cosmic-ray sees exactly what a
`python -m pytest ARGS` would have shown it.

Why a fork sees the mutant: the server imports third-party libraries only, never `canary`,
`reference`, `strategies` or `conformance`, so each child imports those from disk, after
cosmic-ray has written the mutant. Children write no bytecode (`sys.dont_write_bytecode`):
a `.pyc` is validated by the source's size and its modification time in whole seconds, and
two mutants of one module of the same size written within one second would otherwise reuse
the first one's bytecode. The server runs no torch operation, so no thread pool exists to be
broken by `fork`.

A child runs in its own process group and is killed when its time limit (`--limit`, default
the `KV_CANARY_FORK_LIMIT` environment variable or 600 s) passes or its client disconnects
(cosmic-ray's own timeout kills the client).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile

# what every mutant's test run imports; the project's own packages are deliberately absent
PRELOAD = (
    "numpy",
    "torch",
    "triton",
    "triton.language",
    "triton.runtime.interpreter",
    "hypothesis",
    "hypothesis.strategies",
    "hypothesis.stateful",
    "hypothesis.extra.numpy",
    "pytest",
    "_pytest.config",
    "_pytest.python",
    "_pytest.assertion.rewrite",
    "_pytest.main",
    "_pytest.terminal",
)
PROJECT_PACKAGES = (
    "canary",
    "canary_torch",
    "reference",
    "strategies",
    "conformance",
    "strength",
    "tools",
    "tests",
)

_HEADER = struct.Struct("!I")


def _send_message(conn: socket.socket, payload: bytes) -> None:
    conn.sendall(_HEADER.pack(len(payload)) + payload)


def _receive_exactly(conn: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = conn.recv(size)
        if not chunk:
            raise ConnectionError("connection closed mid-message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _receive_message(conn: socket.socket) -> bytes:
    (size,) = _HEADER.unpack(_receive_exactly(conn, _HEADER.size))
    return _receive_exactly(conn, size)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    leaked = sorted(name for name in sys.modules if name.split(".", 1)[0] in PROJECT_PACKAGES)
    if leaked:  # a child would test these modules as they were when the server started
        raise SystemExit(f"forkserver: preloading imported project modules {leaked}")


def _child(conn: socket.socket, request: dict) -> None:
    """In the forked child: run pytest with the request's arguments, output to `conn`."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    sys.path[:0] = [request["cwd"]]
    sys.dont_write_bytecode = True
    os.environ.update(request["env"])
    # the run's temporary files go where its TMPDIR says (the gate gives each run a folder
    # that it removes): the server may have cached another folder, and os._exit below skips
    # the atexit handlers that would remove what the run made
    tempfile.tempdir = None
    fd = conn.fileno()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = sys.stdout
    signal.alarm(int(request["limit"]))  # SIGALRM's default action ends the child
    import pytest

    # pytest cannot rewrite the asserts of plugins the server imported (Hypothesis's): it
    # says so once per run, which is noise here
    args = ["-W", "ignore::pytest.PytestAssertRewriteWarning", *request["args"]]
    status = pytest.main(args)
    sys.stdout.flush()
    os._exit(int(status))


def serve(path: str) -> None:
    _preload()
    # what the server imported lives as long as every run: out of the collector's sight, each
    # run's collections scan only its own objects (gc.freeze, made for servers that fork)
    gc.freeze()
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print(f"forkserver: ready on {path} (pid {os.getpid()})", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            request = json.loads(_receive_message(conn))
        except (ConnectionError, ValueError):
            conn.close()
            continue
        # The watcher forks the run, reports its status to the client and kills the run's
        # process group when the client goes away; the server goes straight back to accept.
        if os.fork() == 0:
            server.close()
            _watch(conn, request)
        conn.close()


def _watch(conn: socket.socket, request: dict) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        try:
            _child(conn, request)
        finally:
            os._exit(70)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child has already done it, or has already exited
    status = None
    try:
        while status is None:
            readable, _, _ = select.select([conn], [], [], 0.1)
            if readable and not conn.recv(1, socket.MSG_PEEK):
                break  # the client hung up: cosmic-ray's timeout, or Ctrl-C
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
    finally:
        if status is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            try:
                conn.sendall(b"\0" + _HEADER.pack(status & 0xFFFFFFFF))
            except OSError:
                pass
        os._exit(0)


def run(path: str, args: list[str], limit: float) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    env = {
        key: value
        for key, value in os.environ.items()
        if key.startswith(("HYPOTHESIS", "KV_CANARY", "CI")) or key == "TMPDIR"
    }
    _send_message(
        conn, json.dumps({"cwd": os.getcwd(), "args": args, "limit": limit, "env": env}).encode()
    )
    out = sys.stdout.buffer
    tail = b""  # the last 5 bytes received, held back: they may be the status trailer
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        tail += chunk
        out.write(tail[:-5])
        out.flush()
        tail = tail[-5:]
    # the watcher ends the stream with a NUL and the status; output itself is text
    if len(tail) == 5 and tail[0] == 0:
        (status,) = _HEADER.unpack(tail[1:])
        # a run ended by a signal reports -signal; exit as a shell would, with 128 + signal
        return status if status < 0x80000000 else 128 + (0x100000000 - status)
    out.write(tail)
    out.flush()
    print("forkserver: the run ended without a status", file=sys.stderr)
    return 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="preload the libraries and serve runs")
    serve_parser.add_argument("--socket", required=True)
    run_parser = sub.add_parser("run", help="run pytest ARGS in a fork of the server")
    run_parser.add_argument("--socket", required=True)
    run_parser.add_argument(
        "--limit", type=float, default=float(os.environ.get("KV_CANARY_FORK_LIMIT", 600))
    )
    run_parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.command == "serve":
        serve(options.socket)
        return 0
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    return run(options.socket, args, options.limit)


if __name__ == "__main__":
    sys.exit(main())
