"""The package against a real cluster: what a program sees through `locus.Client`, the
same as through the mount."""

import errno
import os
import stat as st

import pytest

import locus


def test_write_read_stat_and_list(client, workdir):
    path = f"{workdir}/hello.txt"
    with client.open(path, "wb") as f:
        assert f.write(b"hello ") == 6
        f.write(b"world")
        assert f.tell() == 11
    assert client.read_bytes(path) == b"hello world"
    s = client.stat(path)
    assert st.S_ISREG(s.st_mode) and s.st_size == 11 and s.st_nlink == 1
    assert st.S_ISDIR(client.stat(workdir).st_mode)
    client.mkdir(f"{workdir}/sub", 0o750)
    assert st.S_IMODE(client.stat(f"{workdir}/sub").st_mode) == 0o750 & ~_umask()
    assert sorted(client.listdir(workdir)) == ["hello.txt", "sub"]
    kinds = {name: st.S_ISDIR(s.st_mode) for name, s in client.scandir(workdir)}
    assert kinds == {"hello.txt": False, "sub": True}


def test_seek_append_and_partial_reads(client, workdir):
    path = f"{workdir}/f"
    client.write_bytes(path, bytes(range(256)) * 64)
    with client.open(path, "rb") as f:
        assert f.seek(1000) == 1000
        assert f.read(4) == bytes([1000 % 256, 1001 % 256, 1002 % 256, 1003 % 256])
        assert f.seek(-6, 2) == 256 * 64 - 6 and len(f.read()) == 6
        assert f.read(10) == b""
        assert f.seek(-10, 1) == 256 * 64 - 10
    with client.open(path, "ab") as f:
        f.write(b"tail")
    assert client.read_bytes(path)[-4:] == b"tail"
    with client.open(path, "r+b") as f:
        f.seek(2)
        f.write(b"XY")
    assert client.read_bytes(path)[:5] == bytes([0, 1]) + b"XY" + bytes([4])
    with client.open(path, "wb") as f:  # w truncates
        f.write(b"new")
    assert client.read_bytes(path) == b"new"


def test_large_file_round_trips(client, workdir):
    data = os.urandom(9 << 20)  # more than two 4 MiB chunks
    client.write_bytes(f"{workdir}/big", data)
    assert client.stat(f"{workdir}/big").st_size == len(data)
    assert client.read_bytes(f"{workdir}/big") == data


def test_errors_are_oserrors_with_the_errno(client, workdir):
    with pytest.raises(FileNotFoundError):
        client.stat(f"{workdir}/missing")
    with pytest.raises(FileNotFoundError):
        client.open(f"{workdir}/missing/x", "wb")
    client.write_bytes(f"{workdir}/once", b"1")
    with pytest.raises(FileExistsError):
        client.open(f"{workdir}/once", "xb")
    with pytest.raises(FileExistsError):
        client.mkdir(f"{workdir}/once")
    with pytest.raises(IsADirectoryError):
        client.open(workdir, "rb")
    with pytest.raises(NotADirectoryError):
        client.stat(f"{workdir}/once/below")
    client.mkdir(f"{workdir}/full")
    client.write_bytes(f"{workdir}/full/x", b"")
    with pytest.raises(OSError) as e:
        client.rmdir(f"{workdir}/full")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(ValueError):
        client.open(f"{workdir}/once", "rw")
    f = client.open(f"{workdir}/once", "rb")
    f.close()
    f.close()  # a second close does nothing
    assert f.closed
    with pytest.raises(ValueError):
        f.read()


def test_rename_remove_rmdir_chmod_truncate(client, workdir):
    client.write_bytes(f"{workdir}/a", b"aaaa")
    client.write_bytes(f"{workdir}/b", b"bb")
    client.rename(f"{workdir}/a", f"{workdir}/b")  # replaces, as os.replace
    assert client.listdir(workdir) == ["b"] and client.read_bytes(f"{workdir}/b") == b"aaaa"
    client.mkdir(f"{workdir}/d")
    client.mkdir(f"{workdir}/d/e")
    client.rename(f"{workdir}/d", f"{workdir}/d2")  # the path cache follows the rename
    client.write_bytes(f"{workdir}/d2/e/x", b"x")
    with pytest.raises(FileNotFoundError):
        client.stat(f"{workdir}/d/e/x")
    client.chmod(f"{workdir}/b", 0o600)
    assert st.S_IMODE(client.stat(f"{workdir}/b").st_mode) == 0o600
    client.truncate(f"{workdir}/b", 2)
    assert client.read_bytes(f"{workdir}/b") == b"aa"
    client.remove(f"{workdir}/b")
    client.remove(f"{workdir}/d2/e/x")
    client.rmdir(f"{workdir}/d2/e")
    client.rmdir(f"{workdir}/d2")
    assert client.listdir(workdir) == []


def test_symlinks_and_xattrs(client, workdir):
    client.write_bytes(f"{workdir}/t", b"target")
    client.symlink("t", f"{workdir}/l")
    assert client.readlink(f"{workdir}/l") == "t"
    assert st.S_ISLNK(client.stat(f"{workdir}/l").st_mode)  # not followed, as lstat
    client.setxattr(f"{workdir}/t", "user.k", b"v")
    assert client.getxattr(f"{workdir}/t", "user.k") == b"v"
    assert "user.k" in client.listxattr(f"{workdir}/t")
    client.removexattr(f"{workdir}/t", "user.k")
    with pytest.raises(OSError) as e:
        client.getxattr(f"{workdir}/t", "user.k")
    assert e.value.errno == errno.ENODATA


def test_close_to_open_between_clients(cluster, client, workdir):
    other = locus.connect(**cluster.settings())
    with client.open(f"{workdir}/shared", "wb") as f:
        f.write(b"v1")
    assert other.read_bytes(f"{workdir}/shared") == b"v1"
    with other.open(f"{workdir}/shared", "wb") as f:
        f.write(b"version 2")
    assert client.read_bytes(f"{workdir}/shared") == b"version 2"
    other.close()


def test_whole_file_locks_exclude_other_clients_until_close(cluster, client, workdir):
    other = locus.connect(**cluster.settings())
    path = f"{workdir}/locked"
    client.write_bytes(path, b"x")
    mine = client.open(path, "r+b")
    mine.lock()
    theirs = other.open(path, "rb")
    with pytest.raises(BlockingIOError):
        theirs.lock(exclusive=False)
    mine.close()
    theirs.lock(exclusive=False)
    again = client.open(path, "r+b")
    with pytest.raises(BlockingIOError):
        again.lock()
    again.close()
    theirs.close()
    other.close()


def test_the_mount_and_the_library_see_each_other(cluster, client, workdir):
    if cluster.mount is None:
        pytest.skip("needs root and /dev/fuse")
    here = cluster.mount / workdir.lstrip("/")
    client.write_bytes(f"{workdir}/from-lib", b"written by the library")
    assert (here / "from-lib").read_bytes() == b"written by the library"
    (here / "from-mount").write_bytes(b"written through the mount")
    assert client.read_bytes(f"{workdir}/from-mount") == b"written through the mount"


def test_settings_come_from_arguments_env_and_config(tmp_path, monkeypatch):
    config = tmp_path / "locus.toml"
    config.write_text('[mount]\nmeta = "cfg:1"\nsite = "cfg-site"\nca = "/c/ca.pem"\n')
    monkeypatch.setenv("LOCUS_SITE", "env-site")
    s = locus.settings(config=str(config), cert="/c/me.pem")
    assert s["meta"] == "cfg:1" and s["site"] == "env-site" and s["ca"] == "/c/ca.pem"
    assert s["cert"] == "/c/me.pem" and s["insecure"] is False


def test_a_client_without_a_certificate_is_refused(cluster):
    with pytest.raises(ValueError, match="needs a certificate"):
        locus.Client(cluster.meta)


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
