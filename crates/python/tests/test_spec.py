"""`locus://` through fsspec, and what pandas and pyarrow do with it."""

import fsspec
import pytest

from locus.spec import LocusFileSystem


@pytest.fixture(scope="module")
def fs(cluster):
    s = cluster.settings()
    return fsspec.filesystem("locus", **{k: v for k, v in s.items() if k != "meta"}, meta=s["meta"])


def test_the_protocol_is_registered_and_urls_name_the_meta(cluster, fs):
    assert isinstance(fs, LocusFileSystem)
    assert LocusFileSystem._strip_protocol("locus://h:7070/a/b/") == "/a/b"
    assert LocusFileSystem._get_kwargs_from_urls("locus://h:7070/a") == {"meta": "h:7070"}
    s = cluster.settings()
    url = f"locus://{s['meta']}/url-test.txt"
    opts = {k: v for k, v in s.items() if k != "meta"}
    with fsspec.open(url, "w", **opts) as f:
        f.write("text through a URL\n")
    with fsspec.open(url, "r", **opts) as f:
        assert f.read() == "text through a URL\n"


def test_file_system_operations(fs):
    fs.makedirs("/fsops/a/b", exist_ok=True)
    fs.pipe("/fsops/a/b/one", b"1" * 100)
    fs.pipe("/fsops/a/two", b"22")
    assert fs.cat("/fsops/a/b/one") == b"1" * 100
    assert fs.cat_file("/fsops/a/b/one", start=10, end=15) == b"11111"
    assert fs.cat_file("/fsops/a/two", start=-1) == b"2"
    assert fs.info("/fsops/a/two")["size"] == 2 and fs.info("/fsops/a")["type"] == "directory"
    assert fs.ls("/fsops/a", detail=False) == ["/fsops/a/b", "/fsops/a/two"]
    assert sorted(fs.find("/fsops")) == ["/fsops/a/b/one", "/fsops/a/two"]
    assert fs.glob("/fsops/a/*") == ["/fsops/a/b", "/fsops/a/two"]
    fs.cp("/fsops/a/two", "/fsops/copy")
    assert fs.cat("/fsops/copy") == b"22"
    fs.mv("/fsops/copy", "/fsops/moved")
    assert not fs.exists("/fsops/copy") and fs.cat("/fsops/moved") == b"22"
    fs.cp("/fsops/a", "/fsops/tree", recursive=True)
    assert fs.cat("/fsops/tree/b/one") == b"1" * 100
    fs.rm("/fsops", recursive=True)
    assert not fs.exists("/fsops")
    with pytest.raises(FileNotFoundError):
        fs.info("/fsops")


def test_pandas_and_pyarrow(cluster, fs):
    pd = pytest.importorskip("pandas")
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    s = cluster.settings()
    opts = {k: v for k, v in s.items() if k != "meta"}
    df = pd.DataFrame({"x": range(1000), "y": [f"row {i}" for i in range(1000)]})
    fs.makedirs("/frames", exist_ok=True)
    df.to_csv(f"locus://{s['meta']}/frames/df.csv", index=False, storage_options=opts)
    back = pd.read_csv(f"locus://{s['meta']}/frames/df.csv", storage_options=opts)
    assert back.equals(df)
    table = pa.Table.from_pandas(df)
    pq.write_table(table, "/frames/df.parquet", filesystem=fs)
    assert pq.read_table("/frames/df.parquet", filesystem=fs).equals(table)
    if cluster.mount is None:
        return
    # Written through the mount, read through fsspec, and the other way.
    pq.write_table(table, str(cluster.mount / "frames/by-mount.parquet"))
    assert pq.read_table("/frames/by-mount.parquet", filesystem=fs).equals(table)
    assert pq.read_table(str(cluster.mount / "frames/df.parquet")).equals(table)
