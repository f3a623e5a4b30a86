"""``python -m pytest ...``, ``python -m conformance ...`` and ``python script.py ...`` for the
self-tests, without paying Python's start-up for every run.

Some hundred self-tests run the suite's command as a user would and read its output. Most of
each such run is starting Python and importing torch and numpy (about 2 s of a 3.5 s run).
:func:`run` takes the arguments of ``subprocess.run`` and, for a command
``[sys.executable, "-m", "pytest" | "conformance", ...]`` or ``[sys.executable, "x.py", ...]``
(a call site opts in by calling :func:`run`), runs it in a fork of one server process per test
process that has those libraries imported (this file, run as a script, is the server); any
other command, or one given other keywords, runs as ``subprocess.run`` runs it.

A forked run is what the command would be in a fresh Python, as far as the suite can tell: its
own working directory, exactly the environment it was given (``env``, else this process'), a
``sys.path`` of that folder (a script's: the script's folder), the ``PYTHONPATH`` of that
environment and the interpreter's own folders, ``sys.argv`` as Python sets it, its output in
two files read back as ``stdout`` and ``stderr``, its exit status as Python's
(``SystemExit``'s code, 1 after an uncaught exception), its ``atexit`` functions run, and
``TimeoutExpired`` when ``timeout`` passes (its process group killed). The server imports no
module of the project, so every run imports the project afresh from disk. What a fork cannot
be: a Python without torch, one where torch is not yet imported (a probe of ``sys.modules``
stays a fresh process), or one with interpreter flags. An environment that sets a ``PYTHON*``
variable other than those of :data:`STARTUP_VARIABLES` (read by the interpreter at start-up)
runs as a fresh process, and so does every run when ``KV_CANARY_TESTS_FRESH`` is set
(``tests/test_forked.py`` runs commands both ways and compares).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: What the server imports: the slow part of every run's start-up, no module of the project.
#: Not Triton, which is quick to import: whether an implementation imports it is something
#: the suite reads from ``sys.modules`` (its memory-bounds watch).
PRELOAD = ("numpy", "torch")
#: The modules a forked run may run with ``-m``.
MODULES = ("pytest", "conformance")
#: Keywords of ``subprocess.run`` a forked run supports (any other: a fresh process).
KEYWORDS = frozenset({"cwd", "env", "capture_output", "text", "timeout", "check"})
#: The interpreter's start-up variables a forked run honours (any other: a fresh process).
STARTUP_VARIABLES = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})
FRESH_VARIABLE = "KV_CANARY_TESTS_FRESH"

_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")


def _send(conn: socket.socket, payload: bytes) -> None:
    conn.sendall(_HEADER.pack(len(payload)) + payload)


def _receive(conn: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = conn.recv(size)
        if not chunk:
            raise ConnectionError("the connection closed mid-message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# --- the server (this file run as a script) -------------------------------------------------


def _exit_status(code: object) -> int:
    """The exit status Python gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict, base_path: list[str]) -> None:
    """In the forked child: ``python -m MODULE ARGS`` or ``python SCRIPT ARGS`` as the request
    says, then exit."""
    import runpy
    import traceback

    os.setpgid(0, 0)
    for name in ("SIGCHLD", "SIGINT", "SIGTERM", "SIGPIPE"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    script = request.get("script")
    first = os.path.dirname(os.path.realpath(script)) if script else os.getcwd()
    sys.path[:] = [first, *(os.path.abspath(p) for p in extra), *base_path]
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1 if unbuffered else -1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = [script or request["module"], *request["args"]]
    status = 0
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:  # noqa: BLE001 - as Python's own top level reports it
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _watch(conn: socket.socket, request: dict, base_path: list[str]) -> None:
    """In a forked watcher: fork the run, send its status, or kill its group when the client
    hangs up (its timeout)."""
    import select

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        try:
            _child(request, base_path)
        finally:
            os._exit(70)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child did it already, or has exited
    status = None
    while status is None:
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1, socket.MSG_PEEK):
            break
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
    if status is None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        try:
            conn.sendall(_STATUS.pack(status))
        except OSError:
            pass
    os._exit(0)


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # what the server imported lives as long as every run: out of the collector's sight, each
    # run's collections scan only its own objects (gc.freeze, made for servers that fork)
    gc.freeze()
    base_path = list(sys.path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the watchers
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            (size,) = _HEADER.unpack(_receive(conn, _HEADER.size))
            request = json.loads(_receive(conn, size))
        except (ConnectionError, ValueError):
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            _watch(conn, request, base_path)
        conn.close()


# --- the client ------------------------------------------------------------------------------

_server: dict = {}
_lock = threading.Lock()


def _stop_server() -> None:
    process = _server.pop("process", None)
    if process is not None:
        process.kill()
        process.wait()
    folder = _server.pop("folder", None)
    if folder is not None:
        folder.cleanup()


def _socket_path() -> str:
    """This process' server (started at the first forked run, stopped at exit)."""
    with _lock:
        if "process" not in _server:
            folder = tempfile.TemporaryDirectory(prefix="kv-canary-forked-")
            path = os.path.join(folder.name, "server.sock")
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            process = subprocess.Popen(
                [sys.executable, __file__, path], cwd=folder.name, env=env,
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                process.kill()
                raise RuntimeError("the fork server of tests/forked.py did not start")
            _server.update(process=process, folder=folder, path=path)
            atexit.register(_stop_server)
        return _server["path"]


def _is_script(word) -> bool:
    return str(word).endswith(".py") and os.path.isfile(word)


def forkable(command, keywords: dict) -> bool:
    """Whether ``subprocess.run(command, **keywords)`` can run in a fork of the server: the
    command is ``python -m MODULE ...`` (``MODULE`` one of :data:`MODULES`) or ``python
    SCRIPT.py ...`` with this interpreter and no flag, its output captured."""
    env = keywords.get("env")
    env = os.environ if env is None else env
    if not isinstance(command, (list, tuple)) or len(command) < 2:
        return False
    runs = (len(command) >= 3 and command[1] == "-m" and command[2] in MODULES) or _is_script(
        command[1]
    )
    return (
        FRESH_VARIABLE not in os.environ
        and str(command[0]) == sys.executable
        and runs
        and set(keywords) <= KEYWORDS
        and bool(keywords.get("capture_output"))
        and not any(k.startswith("PYTHON") and k not in STARTUP_VARIABLES for k in env)
    )


def run(command, **keywords) -> subprocess.CompletedProcess:
    """``subprocess.run(command, **keywords)``, forked where :func:`forkable` says it can be."""
    if not forkable(command, keywords):
        return subprocess.run(command, **keywords)  # noqa: PLW1510 - the caller's check
    env = keywords.get("env")
    cwd = Path(keywords.get("cwd") or os.getcwd()).resolve()
    timeout = keywords.get("timeout")
    with tempfile.TemporaryDirectory(prefix="kv-canary-run-") as outputs:
        script = None if command[1] == "-m" else str(Path(command[1]).resolve())
        request = {
            "module": command[2] if script is None else None, "script": script,
            "args": [str(a) for a in command[2 if script else 3 :]], "cwd": str(cwd),
            "env": dict(os.environ if env is None else env),
            "stdout": os.path.join(outputs, "stdout"), "stderr": os.path.join(outputs, "stderr"),
        }  # fmt: skip
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(_socket_path())
            _send(conn, json.dumps(request).encode())
            conn.settimeout(timeout)
            try:
                (status,) = _STATUS.unpack(_receive(conn, _STATUS.size))
            except TimeoutError as late:
                raise subprocess.TimeoutExpired(command, timeout) from late
        finally:
            conn.close()  # after a timeout, the watcher kills the run
        out, err = (Path(request[k]).read_bytes() for k in ("stdout", "stderr"))
    if keywords.get("text"):
        out, err = out.decode(), err.decode()  # type: ignore[assignment]
    done = subprocess.CompletedProcess(list(command), status, out, err)
    if keywords.get("check"):
        done.check_returncode()
    return done


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: no run may import the project from it
    serve(sys.argv[1])
