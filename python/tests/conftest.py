"""The real `spillway-server` on 127.0.0.1:0, started once for the session, as the Rust tests
start it: a fresh data directory, its first-start token, its log read for the address."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def server_binary() -> str:
    """`SPILLWAY_SERVER_BIN`, else the binary the workspace's tests built."""
    found = os.environ.get("SPILLWAY_SERVER_BIN") or str(ROOT / "target" / "debug" / "spillway-server")
    if not Path(found).exists():
        pytest.exit(f"no server binary at {found}: `cargo build -p spillway-server` (or set SPILLWAY_SERVER_BIN)", 2)
    return found


@dataclass
class Server:
    url: str
    token: str
    data: Path
    binary: str
    proc: subprocess.Popen

    def token_for(self, namespace: str, *scopes: str, redacted: bool = False) -> str:
        args = [self.binary, "token", "create", "--data-dir", str(self.data), "--namespace", namespace]
        for s in scopes or ("read", "write", "admin"):
            args += ["--scope", s]
        if redacted:
            args.append("--redacted")
        return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def start_server(data: Path, *extra: str) -> Server:
    binary = server_binary()
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "none", "--data-dir", str(data), *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    addr = None
    assert proc.stderr is not None
    while addr is None:
        line = proc.stderr.readline()
        if not line and (proc.poll() is not None or time.monotonic() > deadline):
            raise RuntimeError("the server did not start")
        m = re.search(r"addr=([0-9.:]+)", line)
        addr = m.group(1) if m else None
    # Keep reading its log, so that it never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    token = (data / "token").read_text().strip()
    return Server(f"http://{addr}", token, data, binary, proc)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("spillway-data"))
    yield srv
    srv.proc.terminate()
    srv.proc.wait(timeout=10)


@pytest.fixture()
def store(server: Server):
    import spillway

    return spillway.Store(server.url, server.token)


@pytest.fixture()
def closed_port() -> str:
    """An address nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture()
def silent_store():
    """A store that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
