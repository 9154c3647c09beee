//! A PostgreSQL connection driven on the calling thread, without a runtime: the
//! socket never blocks, and the caller waits for it with poll(2) while its requests
//! are out. tokio-postgres drives a connection as a future; run on a tokio runtime of
//! its own (as the `postgres` crate does) it could only be blocked on off meta's async
//! workers (`block_in_place`, the blocking pool), and every such hand-off wakes another
//! thread: measured, those hand-offs were as many context switches per op as the round
//! trips themselves. Driven here, a request costs the round trip and nothing else, on
//! whichever thread asks, async worker or not.

use crate::error::MetaError;
use std::future::Future;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::Host;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Config, Connection, NoTls};

/// The server's socket, non-blocking: a read or write that would block answers
/// `Pending` and `Wire::block_on` waits for the socket with poll(2).
struct Socket {
    stream: Stream,
    /// A write found the send buffer full: the next wait is for writability too.
    write_blocked: Arc<AtomicBool>,
}

enum Stream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

impl Socket {
    /// Makes `stream` non-blocking and pairs it with the driver that waits for it.
    fn new(stream: Stream) -> io::Result<(Socket, Driver)> {
        let fd = match &stream {
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                s.as_raw_fd()
            }
            Stream::Unix(s) => {
                s.set_nonblocking(true)?;
                s.as_raw_fd()
            }
        };
        let write_blocked = Arc::new(AtomicBool::new(false));
        let driver = Driver {
            connection: None,
            started: false,
            fd,
            write_blocked: write_blocked.clone(),
            woken: Arc::new(Flag(AtomicBool::new(false))),
        };
        Ok((Socket { stream, write_blocked }, driver))
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().stream.io().read(buf.initialize_unfilled()) {
            Ok(n) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match this.stream.io().write(buf) {
            Ok(n) => Poll::Ready(Ok(n)),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                this.write_blocked.store(true, Ordering::Relaxed);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = match &self.stream {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        };
        Poll::Ready(r)
    }
}

/// Set by any waker: a channel inside the client or the connection moved, so the
/// futures are polled again before waiting for the socket.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// A client and its connection, driven by whoever waits for an answer.
pub(crate) struct Wire {
    /// The handle statements are sent through. Declared before `driver`: dropped
    /// first, it queues the Terminate message the driver's drop then sends.
    pub(crate) client: Client,
    pub(crate) driver: Driver,
}

/// The connection's half of a `Wire`.
pub(crate) struct Driver {
    /// The connection's future; `None` once it ended (the server closed it).
    connection: Option<Connection<Socket, NoTlsStream>>,
    /// Logged in: from then on no connection means it ended.
    started: bool,
    fd: RawFd,
    write_blocked: Arc<AtomicBool>,
    woken: Arc<Flag>,
}

impl Wire {
    /// Connects to the first of `config`'s hosts that answers and logs in.
    pub(crate) fn connect(config: &Config, shown: &str) -> Result<Wire, MetaError> {
        let io_err = |source: io::Error| MetaError::Io {
            what: format!("cannot connect to the PostgreSQL metadata database {shown}"),
            source,
        };
        let stream = open_stream(config).map_err(io_err)?;
        Wire::start(config, stream, shown).map_err(|e| e.or_io(io_err))
    }

    /// Asks the server, over a connection of its own, to cancel what this one is
    /// running; gives up after `timeout`.
    pub(crate) fn cancel(&self, config: &Config, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let stream = open_stream(config)?;
        let (socket, mut driver) = Socket::new(stream)?;
        let token = self.client.cancel_token();
        let cancel = token.cancel_query_raw(socket, NoTls);
        match driver.drive(cancel, Some(&|| deadline))? {
            Some(done) => done.map_err(io::Error::other),
            None => Err(io::Error::new(io::ErrorKind::TimedOut, "the server did not take the cancel request")),
        }
    }

    fn start(config: &Config, stream: Stream, shown: &str) -> Result<Wire, StartError> {
        let (socket, mut driver) = Socket::new(stream)?;
        let (client, connection) = driver
            .block_on_io(config.connect_raw(socket, NoTls))
            .map_err(StartError::Io)?
            .map_err(|source| StartError::Pg(MetaError::Connect { url: shown.into(), source }))?;
        driver.connection = Some(connection);
        driver.started = true;
        Ok(Wire { client, driver })
    }

    /// Whether the server closed the connection (seen by an earlier request).
    pub(crate) fn is_closed(&self) -> bool {
        self.driver.connection.is_none() || self.client.is_closed()
    }
}

impl Driver {
    /// Runs `fut` (requests made with the wire's client) to completion, driving the
    /// connection and waiting for the socket in between.
    pub(crate) fn block_on<T>(&mut self, fut: impl Future<Output = T>) -> Result<T, MetaError> {
        self.block_on_io(fut).map_err(waiting)
    }

    /// As `block_on`, but gives up (`None`) once the instant `until` answers has
    /// passed; it is asked again after every wake-up, so it may move later meanwhile.
    pub(crate) fn block_on_until<T>(
        &mut self,
        fut: impl Future<Output = T>,
        until: impl Fn() -> Instant,
    ) -> Result<Option<T>, MetaError> {
        self.drive(fut, Some(&until)).map_err(waiting)
    }

    fn block_on_io<T>(&mut self, fut: impl Future<Output = T>) -> io::Result<T> {
        Ok(self.drive(fut, None)?.expect("a wait without a deadline ends with an answer"))
    }

    /// Polls `fut` and the connection in turn until `fut` is done (or `until` has
    /// passed: `None`); when neither can move (no waker fired), waits for the socket to
    /// become readable (or writable, after a write found the send buffer full).
    fn drive<T>(&mut self, fut: impl Future<Output = T>, until: Option<&dyn Fn() -> Instant>) -> io::Result<Option<T>> {
        let waker = Waker::from(self.woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = pin!(fut);
        loop {
            self.woken.0.store(false, Ordering::Release);
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return Ok(Some(out));
            }
            if self.started && self.connection.is_none() {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the PostgreSQL server closed the connection"));
            }
            if let Some(c) = self.connection.as_mut()
                && let Poll::Ready(ended) = Pin::new(c).poll(&mut cx)
            {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "PostgreSQL connection ended");
                }
                // Its channels closed: the requests fail at their next poll.
                self.connection = None;
                continue;
            }
            if self.woken.0.load(Ordering::Acquire) {
                continue;
            }
            let timeout = match until {
                None => None,
                Some(until) => match until().checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(None),
                },
            };
            wait(self.fd, self.write_blocked.swap(false, Ordering::Relaxed), timeout)?;
        }
    }
}

fn waiting(source: io::Error) -> MetaError {
    MetaError::Io { what: "waiting for the PostgreSQL server".into(), source }
}

impl Drop for Driver {
    /// Sends what the dropped client queued last (its Terminate message) before the
    /// socket closes.
    fn drop(&mut self) {
        if let Some(mut connection) = self.connection.take() {
            let waker = Waker::from(self.woken.clone());
            let _ = Pin::new(&mut connection).poll(&mut Context::from_waker(&waker));
        }
    }
}

/// Why a connection could not start: the socket, or PostgreSQL's login.
enum StartError {
    Io(io::Error),
    Pg(MetaError),
}

impl From<io::Error> for StartError {
    fn from(e: io::Error) -> Self {
        StartError::Io(e)
    }
}

impl StartError {
    fn or_io(self, io_err: impl FnOnce(io::Error) -> MetaError) -> MetaError {
        match self {
            StartError::Io(e) => io_err(e),
            StartError::Pg(e) => e,
        }
    }
}

/// A socket to the first of `config`'s hosts that accepts one.
fn open_stream(config: &Config) -> io::Result<Stream> {
    let ports = config.get_ports();
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no host in the URL");
    for (i, host) in config.get_hosts().iter().enumerate() {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let stream = match host {
            Host::Tcp(name) => connect_tcp(name, port, config.get_connect_timeout().copied()).map(Stream::Tcp),
            Host::Unix(dir) => {
                std::os::unix::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).map(Stream::Unix)
            }
        };
        match stream {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn connect_tcp(name: &str, port: u16, timeout: Option<std::time::Duration>) -> io::Result<std::net::TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{name} resolves to no address"));
    for addr in (name, port).to_socket_addrs()? {
        let r = match timeout {
            Some(t) => std::net::TcpStream::connect_timeout(&addr, t),
            None => std::net::TcpStream::connect(addr),
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Blocks until `fd` is readable (or, with `write`, writable), has hung up, or
/// `timeout` has passed.
fn wait(fd: RawFd, write: bool, timeout: Option<Duration>) -> io::Result<()> {
    let events = libc::POLLIN | if write { libc::POLLOUT } else { 0 };
    let mut pfd = libc::pollfd { fd, events, revents: 0 };
    // Rounded up: a wait that ends a little early only polls once more.
    let ms = timeout.map_or(-1, |t| t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
    loop {
        // SAFETY: `pfd` is a valid, exclusively borrowed pollfd for the duration of the
        // call and the count passed is 1, its length.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
