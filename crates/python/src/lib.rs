//! The `locus` Python package's native module (`locus._locus`): `Client` and `File`
//! over `client::Client`, the path-based API the FUSE mount's `Vfs` serves. Each call
//! releases the GIL while it waits on the network; errors become `OSError` with the
//! errno a mount would give (Python turns ENOENT into `FileNotFoundError`, and so on).

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use util::sync::lock;

/// The runtime every client of the process shares (two workers: calls block on it
/// from Python threads, which do the waiting).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("locus")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PyOSError::new_err(format!("cannot start the Locus runtime: {e}")))
}

/// Runs `work` on the runtime with the GIL released.
fn wait<T: Send>(py: Python<'_>, work: impl Future<Output = Result<T, client::VfsError>> + Send) -> PyResult<T> {
    let rt = runtime()?;
    py.detach(|| rt.block_on(work)).map_err(os_error)
}

fn os_error(e: client::VfsError) -> PyErr {
    PyOSError::new_err((e.errno(), e.context))
}

/// The security this process speaks with, installed by its first `Client` (one per
/// process, as for every Locus program): `None` before.
static SECURITY: Mutex<Option<String>> = Mutex::new(None);

/// Installs the process's TLS identity, or plain TCP when `insecure`; a later client
/// must ask for the same.
fn install_security(ca: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>, insecure: bool) -> PyResult<()> {
    let wanted = match (&ca, &cert, &key, insecure) {
        (_, _, _, true) => "insecure".to_string(),
        (Some(ca), Some(cert), Some(key), false) => format!("{}|{}|{}", ca.display(), cert.display(), key.display()),
        _ => {
            return Err(PyValueError::new_err(
                "a Locus client needs a certificate: pass ca, cert and key (or set LOCUS_CA, LOCUS_CERT and \
                 LOCUS_KEY), or insecure=True on a closed test network",
            ));
        }
    };
    let mut installed = lock(&SECURITY);
    match installed.as_deref() {
        Some(same) if same == wanted => return Ok(()),
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "this process already speaks to Locus as {other}; one process has one identity"
            )));
        }
        None => {}
    }
    let security = match (ca, cert, key) {
        (Some(ca), Some(cert), Some(key)) if !insecure => net::Security::Tls(Arc::new(
            net::Tls::load(&ca, &cert, &key).map_err(|e| PyValueError::new_err(format!("TLS: {e}")))?,
        )),
        _ => net::Security::Insecure,
    };
    net::secure(security);
    *installed = Some(wanted);
    Ok(())
}

/// A connection to a Locus namespace, acting for this process's user.
#[pyclass(frozen, name = "Client", module = "locus")]
struct Client {
    inner: Arc<client::Client>,
}

#[pymethods]
impl Client {
    /// Connects to the meta at `meta` (`host:port`) as a client of `site`.
    #[new]
    #[pyo3(signature = (meta, site = "default".to_string(), ca = None, cert = None, key = None, insecure = false))]
    fn new(
        py: Python<'_>,
        meta: String,
        site: String,
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        insecure: bool,
    ) -> PyResult<Client> {
        install_security(ca, cert, key, insecure)?;
        let config = client::ClientConfig { meta_addr: meta, site, purpose: "python".into(), ..Default::default() };
        let inner = wait(py, client::Client::connect(config))?;
        Ok(Client { inner: Arc::new(inner) })
    }

    /// `os.lstat` of `path`.
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<Stat> {
        Ok(Stat::from(wait(py, self.inner.stat(path))?))
    }

    /// The names in directory `path`, as `os.listdir`.
    fn listdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<String>> {
        Ok(wait(py, self.inner.list(path))?.into_iter().map(|e| e.name).collect())
    }

    /// `(name, Stat)` of every entry of directory `path`, in one listing.
    fn scandir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, Stat)>> {
        Ok(wait(py, self.inner.list(path))?.into_iter().map(|e| (e.name, Stat::from(e.attr))).collect())
    }

    #[pyo3(signature = (path, mode = 0o777))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        wait(py, self.inner.mkdir(path, mode)).map(drop)
    }

    /// Removes a file (`os.remove`).
    fn remove(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        wait(py, self.inner.remove(path))
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        wait(py, self.inner.rmdir(path))
    }

    /// `os.replace`: a file or empty directory at `dst` is replaced.
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        wait(py, self.inner.rename(src, dst))
    }

    fn chmod(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        wait(py, self.inner.chmod(path, mode)).map(drop)
    }

    fn truncate(&self, py: Python<'_>, path: &str, length: u64) -> PyResult<()> {
        wait(py, self.inner.truncate(path, length)).map(drop)
    }

    /// Makes `path` a symlink pointing at `target` (`os.symlink(target, path)`).
    fn symlink(&self, py: Python<'_>, target: &str, path: &str) -> PyResult<()> {
        wait(py, self.inner.symlink(target, path)).map(drop)
    }

    fn readlink(&self, py: Python<'_>, path: &str) -> PyResult<String> {
        wait(py, self.inner.readlink(path))
    }

    fn getxattr<'py>(&self, py: Python<'py>, path: &str, name: &str) -> PyResult<Bound<'py, PyBytes>> {
        let value = wait(py, self.inner.getxattr(path, name))?;
        Ok(PyBytes::new(py, &value))
    }

    fn setxattr(&self, py: Python<'_>, path: &str, name: &str, value: &[u8]) -> PyResult<()> {
        let value = value.to_vec();
        wait(py, self.inner.setxattr(path, name, &value))
    }

    fn listxattr(&self, py: Python<'_>, path: &str) -> PyResult<Vec<String>> {
        wait(py, self.inner.listxattr(path))
    }

    fn removexattr(&self, py: Python<'_>, path: &str, name: &str) -> PyResult<()> {
        wait(py, self.inner.removexattr(path, name))
    }

    /// The whole content of the file at `path`.
    fn read_bytes<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = wait(py, self.inner.read_file(path))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Makes `data` the whole content of the file at `path` (created if missing).
    fn write_bytes(&self, py: Python<'_>, path: &str, data: &[u8]) -> PyResult<()> {
        let data = data.to_vec();
        wait(py, self.inner.write_file(path, &data))
    }

    /// Opens the file at `path` with a Python mode (`r`, `w`, `a`, `x`, with `+` and
    /// `b`); bytes only. A created file gets `perm` before the umask.
    #[pyo3(signature = (path, mode = "rb", perm = 0o666))]
    fn open(&self, py: Python<'_>, path: &str, mode: &str, perm: u32) -> PyResult<File> {
        let how = client::OpenMode::parse(mode).map_err(|e| PyValueError::new_err(e.context))?;
        let file = wait(py, self.inner.open(path, how, perm))?;
        Ok(File { file: Mutex::new(Some(file)), how, path: path.to_string() })
    }

    /// Ends the session (its locks go); files still open lose what they did not flush.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        wait(py, async move {
            inner.shutdown().await;
            Ok(())
        })
    }
}

/// An open file: `read`, `write`, `seek`, `tell`, `close`, and `with`.
#[pyclass(frozen, name = "File", module = "locus")]
struct File {
    /// `None` once closed.
    file: Mutex<Option<client::OpenFile>>,
    how: client::OpenMode,
    path: String,
}

impl File {
    /// Runs `f` on the open file, with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl AsyncFnOnce(&mut client::OpenFile) -> Result<T, client::VfsError> + Send,
    ) -> PyResult<T> {
        let rt = runtime()?;
        py.detach(|| {
            let mut guard = lock(&self.file);
            let file = guard.as_mut().ok_or_else(|| PyValueError::new_err("I/O operation on closed file"))?;
            rt.block_on(f(file)).map_err(os_error)
        })
    }
}

#[pymethods]
impl File {
    /// Up to `size` bytes from the position (all to the end when `size` < 0).
    #[pyo3(signature = (size = -1))]
    fn read<'py>(&self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.with(py, async |f| match usize::try_from(size) {
            Ok(n) => f.read(n).await,
            Err(_) => f.read_to_end().await.map(bytes::Bytes::from),
        })?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Writes all of `data`; returns its length.
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<usize> {
        let data = data.to_vec();
        self.with(py, async move |f| f.write(&data).await)
    }

    /// Moves the position as `io.IOBase.seek` (`whence` 0, 1 or 2).
    #[pyo3(signature = (offset, whence = 0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let to = match whence {
            0 => std::io::SeekFrom::Start(
                u64::try_from(offset).map_err(|_| PyValueError::new_err(format!("negative seek position {offset}")))?,
            ),
            1 => std::io::SeekFrom::Current(offset),
            2 => std::io::SeekFrom::End(offset),
            _ => return Err(PyValueError::new_err(format!("whence {whence} is not 0, 1 or 2"))),
        };
        self.with(py, async move |f| f.seek(to).await)
    }

    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, async |f| Ok(f.tell()))
    }

    /// Commits what was written and makes it durable.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, async |f| f.fsync().await)
    }

    /// Locks the whole file, exclusively or shared (as `fcntl.lockf` over every byte),
    /// at meta, so every client at every site sees it; `BlockingIOError` while another
    /// holds a conflicting lock. `close` lets it go, as does the end of this client.
    #[pyo3(signature = (exclusive = true))]
    fn lock(&self, py: Python<'_>, exclusive: bool) -> PyResult<()> {
        self.with(py, async move |f| f.lock_whole(exclusive).await)
    }

    /// Nothing to do: writes are committed by `close` and `fsync` (close-to-open).
    fn flush(&self) {}

    fn readable(&self) -> bool {
        self.how.read
    }

    fn writable(&self) -> bool {
        self.how.write
    }

    fn seekable(&self) -> bool {
        true
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.file).is_none()
    }

    #[getter]
    fn name(&self) -> String {
        self.path.clone()
    }

    /// Commits what was written and lets the file go; a second close does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = lock(&self.file).take();
        let Some(mut file) = taken else { return Ok(()) };
        wait(py, async move { file.close().await })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// `os.stat_result`'s fields that Locus keeps.
#[pyclass(frozen, get_all, name = "Stat", module = "locus")]
#[derive(Clone)]
struct Stat {
    st_mode: u32,
    st_ino: u64,
    st_nlink: u32,
    st_uid: u32,
    st_gid: u32,
    st_size: u64,
    st_atime: f64,
    st_mtime: f64,
    st_ctime: f64,
    st_atime_ns: i128,
    st_mtime_ns: i128,
    st_ctime_ns: i128,
}

impl From<proto::types::Attr> for Stat {
    fn from(a: proto::types::Attr) -> Stat {
        use proto::types::FileKind;
        let kind = match a.kind {
            FileKind::File => 0o100000,
            FileKind::Dir => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
            FileKind::CharDevice => 0o020000,
            FileKind::BlockDevice => 0o060000,
        };
        let ns = |t: proto::types::Timestamp| i128::from(t.secs) * 1_000_000_000 + i128::from(t.nanos);
        let secs = |t: proto::types::Timestamp| t.secs as f64 + f64::from(t.nanos) / 1e9;
        Stat {
            st_mode: kind | (a.mode & 0o7777),
            st_ino: a.ino,
            st_nlink: a.nlink,
            st_uid: a.uid,
            st_gid: a.gid,
            st_size: a.size,
            st_atime: secs(a.atime),
            st_mtime: secs(a.mtime),
            st_ctime: secs(a.ctime),
            st_atime_ns: ns(a.atime),
            st_mtime_ns: ns(a.mtime),
            st_ctime_ns: ns(a.ctime),
        }
    }
}

#[pymethods]
impl Stat {
    fn __repr__(&self) -> String {
        format!(
            "locus.Stat(st_mode={:#o}, st_ino={}, st_nlink={}, st_uid={}, st_gid={}, st_size={}, st_mtime={})",
            self.st_mode, self.st_ino, self.st_nlink, self.st_uid, self.st_gid, self.st_size, self.st_mtime
        )
    }
}

#[pymodule]
fn _locus(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<File>()?;
    m.add_class::<Stat>()?;
    Ok(())
}
