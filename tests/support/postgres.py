"""A real PostgreSQL server for a test: the initdb and postgres binaries of the `pgserver` wheel
(the test extra), a database cluster in the test's folder listening on 127.0.0.1 at a free port,
password login (SCRAM), stopped by pid with the test's other servers (`servers` fixture).
PostgreSQL refuses to run as root: as root the server runs as `nobody`, in a folder of its own
under the system's temporary folder (a test's folder is private to root), removed with the server.
Durability is off (fsync, synchronous commit): a test's database lives as long as the test."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.support.servers import Servers, free_port

USER, PASSWORD = "vacsr", "pg-s3cr3t-pw"


def _binaries() -> Path:
    spec = find_spec("pgserver")  # located, not imported: its import writes a runtime folder
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the pgserver wheel is missing: install the test extra (make install)")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def _as_owner(folder: Path):
    """(preexec function, environment) that run a PostgreSQL program as the owner of `folder`:
    `nobody` when this process is root (the folder is handed to it), else this user."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    if os.geteuid() != 0:
        return None, env
    import pwd

    nobody = pwd.getpwnam("nobody")
    for path in (folder, *folder.rglob("*")):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)

    def drop() -> None:
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    return drop, dict(env, HOME=str(folder))


def start_postgresql(servers: Servers, timeout: float = 120) -> str:
    """A new PostgreSQL server; its URL without a database, as users write it
    (`postgresql://vacsr:<password>@127.0.0.1:<port>`). Add one with `create_database`."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="vacsr-pg-"))  # short: the server's socket path
    folder.chmod(0o755)
    servers.folders.append(folder)
    (folder / "password").write_text(PASSWORD + "\n")
    run_as, env = _as_owner(folder)
    bin_dir, data = _binaries(), folder / "data"
    subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "--pwfile",
                    str(folder / "password"), "--auth=scram-sha-256", "--no-sync", "-E", "UTF8",
                    "--locale=C"], check=True, capture_output=True, preexec_fn=run_as, env=env,
                   timeout=timeout)
    port = free_port()
    log = open(folder / "postgres.log", "a")
    process = subprocess.Popen(
        [str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
         "-k", str(folder), "-c", "fsync=off", "-c", "synchronous_commit=off",
         "-c", "full_page_writes=off", "-c", "max_connections=200"],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=run_as, env=env,
        start_new_session=True)
    process.stop_signal = signal.SIGINT  # a fast shutdown: SIGTERM waits for every client
    servers.started.append(process)
    url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}"
    deadline = time.time() + timeout
    while True:
        try:
            _connect(url, "postgres").close()
            return url
        except Exception:
            if process.poll() is not None or time.time() > deadline:
                pytest.fail("postgres did not come up:\n" + (folder / "postgres.log").read_text()
                            [-2000:])
            time.sleep(0.2)


def _connect(url: str, database: str):
    import psycopg

    return psycopg.connect(f"{url}/{database}", password=PASSWORD, autocommit=True,
                           connect_timeout=5)


def create_database(url: str, name: str) -> str:
    """A new database `name` on the server at `url`; its URL."""
    with _connect(url, "postgres") as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return f"{url}/{name}"
