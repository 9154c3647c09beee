"""fsspec's own abstract test suite (copy, get, put, open, pipe) on `locus://`."""

import uuid

import fsspec
import fsspec.tests.abstract as abstract
import pytest


@pytest.fixture(scope="module")
def locus_fs(cluster):
    s = cluster.settings()
    return fsspec.filesystem("locus", **s)


class LocusFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, locus_fs):
        return locus_fs

    @pytest.fixture
    def fs_path(self, locus_fs):
        path = f"/abstract-{uuid.uuid4().hex[:12]}"
        locus_fs.mkdir(path)
        yield path
        if locus_fs.exists(path):
            locus_fs.rm(path, recursive=True)


class TestLocusCopy(abstract.AbstractCopyTests, LocusFixtures):
    pass


class TestLocusGet(abstract.AbstractGetTests, LocusFixtures):
    pass


class TestLocusPut(abstract.AbstractPutTests, LocusFixtures):
    pass


class TestLocusOpen(abstract.AbstractOpenTests, LocusFixtures):
    pass


class TestLocusPipe(abstract.AbstractPipeTests, LocusFixtures):
    pass
