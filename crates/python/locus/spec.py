"""An fsspec file system for ``locus://`` URLs, registered as fsspec's ``locus`` protocol::

    import fsspec, pandas
    df = pandas.read_csv("locus://meta-a:7070/data/run1.csv")
    with fsspec.open("locus://meta-a:7070/out/x.bin", "wb", site="a") as f:
        f.write(b"...")

The URL's host and port name the meta; everything else comes from ``locus.settings``
(arguments such as ``site=``, then ``LOCUS_*``, then the config file's ``[mount]``).
"""

import datetime
from urllib.parse import urlsplit

from fsspec import AbstractFileSystem

from . import connect

_KIND = {0o100000: "file", 0o040000: "directory"}
_COPY_BLOCK = 8 << 20


class LocusFileSystem(AbstractFileSystem):
    """A Locus namespace through ``locus.Client`` (no mount)."""

    protocol = "locus"
    root_marker = "/"

    def __init__(
        self, meta=None, site=None, ca=None, cert=None, key=None, insecure=None, config=None, auto_mkdir=True, **kwargs
    ):
        """`auto_mkdir`: writing a file makes its missing parent directories, as object
        stores behave and fsspec's tools expect."""
        super().__init__(**kwargs)
        self.client = connect(meta, site, ca, cert, key, insecure, config)
        self.auto_mkdir = auto_mkdir

    def _parents_for(self, path):
        if self.auto_mkdir:
            parent = self._parent(path)
            if parent != "/" and not self.exists(parent):
                self.makedirs(parent, exist_ok=True)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("locus://"):
            path = urlsplit(path).path
        path = "/" + path.strip("/")
        return path

    @staticmethod
    def _get_kwargs_from_urls(path):
        netloc = urlsplit(str(path)).netloc if str(path).startswith("locus://") else ""
        return {"meta": netloc} if netloc else {}

    def _info(self, path, st):
        kind = _KIND.get(st.st_mode & 0o170000, "other")
        return {
            "name": path,
            "size": st.st_size,
            "type": kind,
            "mode": st.st_mode,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime": st.st_mtime,
            "islink": st.st_mode & 0o170000 == 0o120000,
        }

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._info(path, self.client.stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if st.st_mode & 0o170000 != 0o040000:
            entries = [self._info(path, st)]
        else:
            base = path.rstrip("/")
            entries = [self._info(f"{base}/{name}", s) for name, s in sorted(self.client.scandir(path))]
        return entries if detail else [e["name"] for e in entries]

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            self.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if path == "/":
            if not exist_ok:
                raise FileExistsError(path)
            return
        parent = self._parent(path)
        if not self.exists(parent):
            self.makedirs(parent, exist_ok=True)
        try:
            self.client.mkdir(path)
        except FileExistsError:
            if not exist_ok or not self.isdir(path):
                raise

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        """Removes a file, or an empty directory (fsspec's recursive `rm` removes both
        with it, deepest first)."""
        path = self._strip_protocol(path)
        if self.isdir(path):
            self.client.rmdir(path)
        else:
            self.client.remove(path)

    _rm = rm_file

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """A rename where both are single paths (atomic, any size); fsspec's copy and
        delete for globs and lists."""
        if isinstance(path1, str) and isinstance(path2, str) and not any(c in path1 for c in "*?["):
            src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
            if self.isdir(dst):
                dst = dst.rstrip("/") + "/" + src.rstrip("/").rsplit("/", 1)[-1]
            self.client.rename(src, dst)
            return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        self._parents_for(path2)
        with self.client.open(path1, "rb") as src, self.client.open(path2, "wb") as dst:
            while block := src.read(_COPY_BLOCK):
                dst.write(block)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if not autocommit:
            raise NotImplementedError("Locus commits on close; transactions are not supported")
        path = self._strip_protocol(path)
        if "r" not in mode or "+" in mode:
            self._parents_for(path)
        return self.client.open(path, mode)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.read_bytes(path)
        with self.client.open(path, "rb") as f:
            size = f.seek(0, 2)
            start = 0 if start is None else (start if start >= 0 else max(0, size + start))
            end = size if end is None else (end if end >= 0 else max(0, size + end))
            f.seek(start)
            return f.read(max(0, end - start))

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        if mode == "create" and self.exists(path):
            raise FileExistsError(path)
        self._parents_for(path)
        self.client.write_bytes(path, bytes(value))

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self._parents_for(path)
            self.client.write_bytes(path, b"")

    def modified(self, path):
        return datetime.datetime.fromtimestamp(self.client.stat(self._strip_protocol(path)).st_mtime, datetime.timezone.utc)

    def created(self, path):
        return datetime.datetime.fromtimestamp(self.client.stat(self._strip_protocol(path)).st_ctime, datetime.timezone.utc)
