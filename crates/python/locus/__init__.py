"""Locus without a mount.

``locus.connect()`` opens a client of a Locus namespace (the same protocol, consistency
and security as ``locus mount``, without FUSE); ``locus.spec.LocusFileSystem`` serves
``locus://`` URLs to fsspec (pandas, pyarrow, dask, zarr)::

    import locus
    fs = locus.connect("meta-a:7070", site="a")   # or LOCUS_META, LOCUS_CA, ...
    with fs.open("/data/run1.csv", "wb") as f:
        f.write(b"x,y\\n1,2\\n")
    print(fs.read_bytes("/data/run1.csv"), fs.stat("/data").st_mode)
"""

import os

from ._locus import Client, File, Stat

__all__ = ["Client", "File", "Stat", "connect", "settings"]


def settings(meta=None, site=None, ca=None, cert=None, key=None, insecure=None, config=None):
    """The connection settings as ``locus mount`` would take them: the arguments given,
    else the environment (``LOCUS_META``, ``LOCUS_SITE``, ``LOCUS_CA``, ``LOCUS_CERT``,
    ``LOCUS_KEY``, ``LOCUS_INSECURE_NO_TLS``), else the ``[mount]`` table of the TOML
    config file ``config`` (or ``LOCUS_CONFIG``), else the defaults."""
    table = {}
    config = config or os.environ.get("LOCUS_CONFIG")
    if config:
        try:
            import tomllib
        except ImportError:  # Python < 3.11
            import tomli as tomllib

        with open(config, "rb") as f:
            table = tomllib.load(f).get("mount", {})

    def pick(given, env, name, default=None):
        if given is not None:
            return given
        if os.environ.get(env):
            return os.environ[env]
        return table.get(name, table.get(name.replace("_", "-"), default))

    insecure = pick(insecure, "LOCUS_INSECURE_NO_TLS", "insecure_no_tls", False)
    if isinstance(insecure, str):
        insecure = insecure.lower() in ("1", "true", "yes")
    return {
        "meta": pick(meta, "LOCUS_META", "meta", "127.0.0.1:7070"),
        "site": pick(site, "LOCUS_SITE", "site", "default"),
        "ca": pick(ca, "LOCUS_CA", "ca"),
        "cert": pick(cert, "LOCUS_CERT", "cert"),
        "key": pick(key, "LOCUS_KEY", "key"),
        "insecure": bool(insecure),
    }


def connect(meta=None, site=None, ca=None, cert=None, key=None, insecure=None, config=None):
    """A ``Client`` configured by ``settings``."""
    return Client(**settings(meta, site, ca, cert, key, insecure, config))
