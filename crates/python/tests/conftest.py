"""A real Locus cluster for the package's tests: `locus meta` (SQLite) and one `locus
node` on 127.0.0.1 with a CA of their own, and, where this machine can mount (root and
/dev/fuse), a `locus mount` of the same namespace to check against. The `locus` binary
is $LOCUS_BIN, else the workspace's target/debug/locus."""

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LOCUS = os.environ.get("LOCUS_BIN", str(ROOT / "target" / "debug" / "locus"))
SITE = "a"


def _wait_line(proc, log, pattern, what, seconds=60):
    """The first match of `pattern` in file `log`, waiting at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
        m = re.search(pattern, text)
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start: {Path(log).read_text(errors='replace')[-2000:]}")


class Cluster:
    def __init__(self, top):
        self.top = Path(top)
        self.procs = []
        ca = self.top / "ca"
        self._run("ca", "init", "--dir", str(ca))
        for role, name in [("meta", "meta"), ("node", "n1"), ("client", "py"), ("client", "mnt"), ("admin", "admin")]:
            self._run("ca", "issue", "--dir", str(ca), "--role", role, "--name", name, "--site", SITE)
        self.ca = ca
        meta = self._spawn(
            "meta",
            ["meta", "--listen", "127.0.0.1:0", "--db", str(self.top / "meta.db"), "--init",
             "--admit-node", "n1", "--no-root-squash", SITE, *self.tls("meta")],
        )
        self.meta = _wait_line(meta, self.top / "meta.out", r"listening on (\S+)", "meta").group(1)
        node = self._spawn(
            "node",
            ["node", "--listen", "127.0.0.1:0", "--meta", self.meta, "--data-dir", str(self.top / "n1"),
             "--id", "n1", "--site", SITE, *self.tls("n1")],
        )
        _wait_line(node, self.top / "node.out", r"listening on", "node")
        deadline = time.monotonic() + 30
        while self._run("status", "--meta", self.meta, *self.tls("admin"), check=False).stdout.count(" n1 ") == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("node n1 did not register")
            time.sleep(0.1)
        self._run("policy", "set", "/", "--copies", "1", "--meta", self.meta, *self.tls("admin"))
        self.mount = None
        if os.geteuid() == 0 and os.path.exists("/dev/fuse"):
            mnt = self.top / "mnt"
            mnt.mkdir()
            proc = self._spawn("mount", ["mount", str(mnt), "--meta", self.meta, "--site", SITE, *self.tls("mnt")])
            _wait_line(proc, self.top / "mount.out", r"mounted on", "mount")
            self.mount = mnt

    def tls(self, name):
        return ["--ca", str(self.ca / "ca.pem"), "--cert", str(self.ca / f"{name}.pem"),
                "--key", str(self.ca / f"{name}.key")]

    def settings(self):
        """`locus.connect`'s arguments for the package's own certificate."""
        return {"meta": self.meta, "site": SITE, "ca": str(self.ca / "ca.pem"),
                "cert": str(self.ca / "py.pem"), "key": str(self.ca / "py.key")}

    def _run(self, *args, check=True):
        return subprocess.run([LOCUS, *args], capture_output=True, text=True, check=check, timeout=60)

    def _spawn(self, name, args):
        out = open(self.top / f"{name}.out", "w")
        err = open(self.top / f"{name}.err", "w")
        proc = subprocess.Popen([LOCUS, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append((proc, name))
        return proc

    def stop(self):
        if self.mount is not None:
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
        for proc, _ in reversed(self.procs):
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="session")
def cluster():
    with tempfile.TemporaryDirectory(prefix="locus-py-") as top:
        c = Cluster(top)
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture(scope="session")
def client(cluster):
    import locus

    return locus.connect(**cluster.settings())


@pytest.fixture
def workdir(client, request):
    """A fresh directory per test, named after it."""
    path = "/" + request.node.name.replace("[", "-").replace("]", "")
    client.mkdir(path)
    return path
