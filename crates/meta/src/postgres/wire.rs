//! A PostgreSQL connection driven on the calling thread, without a runtime: the
//! socket never blocks, and the caller waits for it with poll(2) while its requests
//! are out. tokio-postgres drives a connection as a future; run on a tokio runtime of
//! its own (as the `postgres` crate does) it could only be blocked on off meta's async
//! workers (`block_in_place`, the blocking pool), and every such hand-off wakes another
//! thread: measured, those hand-offs were as many context switches per op as the round
//! trips themselves. Driven here, a request costs the round trip and nothing else, on
//! whichever thread asks, async worker or not.

use super::pg_detail;
use crate::error::MetaError;
use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::{self, ErrorFields};
use postgres_protocol::message::frontend;
use std::collections::{HashMap, VecDeque};
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
use tokio_postgres::types::{IsNull, ToSql, Type};
use tokio_postgres::{Client, Config, Connection, NoTls};

/// The server's socket, non-blocking: a read or write that would block answers
/// `Pending` and `Driver::block_on_until` waits for the socket with poll(2).
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

    fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

impl Socket {
    /// Makes `stream` non-blocking and pairs it with the driver that waits for it.
    fn new(stream: Stream) -> io::Result<(Socket, Driver)> {
        match &stream {
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
            }
            Stream::Unix(s) => s.set_nonblocking(true)?,
        }
        let write_blocked = Arc::new(AtomicBool::new(false));
        let driver = Driver {
            connection: None,
            started: false,
            raw: stream.try_clone()?,
            prepared: HashMap::new(),
            names: 0,
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
pub(super) struct Wire {
    /// The handle statements are sent through. Declared before `driver`: dropped
    /// first, it queues the Terminate message the driver's drop then sends.
    pub(super) client: Client,
    pub(super) driver: Driver,
}

/// The connection's half of a `Wire`.
pub(super) struct Driver {
    /// The connection's future; `None` once it ended (the server closed it).
    connection: Option<Connection<Socket, NoTlsStream>>,
    /// Logged in: from then on no connection means it ended.
    started: bool,
    /// The same socket (a second descriptor of it): waited for with poll(2), and used
    /// for pipelines sent by hand (`send_prepared`) while the connection's future is idle.
    raw: Stream,
    /// The names of the statements prepared for `send_prepared`, by their SQL text
    /// (apart from tokio-postgres's own, whose names it keeps to itself). A statement
    /// whose Parse failed never gets here, and the next try uses a new name.
    prepared: HashMap<&'static str, String>,
    /// Names given to statements prepared for `send_prepared`, never reused.
    names: u64,
    write_blocked: Arc<AtomicBool>,
    woken: Arc<Flag>,
}

impl Wire {
    /// Connects to the first of `config`'s hosts that answers and logs in.
    pub(super) fn connect(config: &Config, shown: &str) -> Result<Wire, MetaError> {
        let io_err = |source: io::Error| MetaError::Io {
            what: format!("cannot connect to the PostgreSQL metadata database {shown}"),
            source,
        };
        let stream = open_stream(config).map_err(io_err)?;
        Wire::start(config, stream, shown).map_err(|e| e.or_io(io_err))
    }

    /// Asks the server, over a connection of its own, to cancel what this one is
    /// running; gives up after `timeout`.
    pub(super) fn cancel(&self, config: &Config, timeout: Duration) -> io::Result<()> {
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

    /// Logs in over `stream`, within the config's connect timeout (a server that
    /// accepts connections but never answers, such as a stopped one, is given up on).
    fn start(config: &Config, stream: Stream, shown: &str) -> Result<Wire, StartError> {
        let (socket, mut driver) = Socket::new(stream)?;
        let timeout = config.get_connect_timeout().copied();
        let until = timeout.map(|t| Instant::now() + t);
        let until = until.as_ref().map(|at| move || *at);
        let logged_in = driver
            .drive(config.connect_raw(socket, NoTls), until.as_ref().map(|f| f as &dyn Fn() -> Instant))
            .map_err(StartError::Io)?;
        let Some(logged_in) = logged_in else {
            let why = format!("the server took the connection but did not complete the login within {timeout:?}");
            return Err(StartError::Io(io::Error::new(io::ErrorKind::TimedOut, why)));
        };
        let (client, connection) =
            logged_in.map_err(|e| StartError::Pg(MetaError::Connect { url: shown.into(), detail: pg_detail(&e) }))?;
        driver.connection = Some(connection);
        driver.started = true;
        Ok(Wire { client, driver })
    }

    /// Whether the server closed the connection (seen by an earlier request).
    pub(super) fn is_closed(&self) -> bool {
        self.driver.connection.is_none() || self.client.is_closed()
    }
}

impl Driver {
    /// Runs `fut` (requests made with the wire's client) to completion, driving the
    /// connection and waiting for the socket in between; gives up (`None`) once the
    /// instant `until` answers has passed (never without one). `until` is asked again
    /// after every wake-up, so it may move later meanwhile.
    pub(super) fn block_on_until<T>(
        &mut self,
        fut: impl Future<Output = T>,
        until: Option<&dyn Fn() -> Instant>,
    ) -> Result<Option<T>, MetaError> {
        self.drive(fut, until).map_err(waiting)
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
            let Some(timeout) = time_left(until) else { return Ok(None) };
            wait(self.raw.fd(), self.write_blocked.swap(false, Ordering::Relaxed), timeout)?;
        }
    }
}

/// One statement of a pipeline sent by `Driver::send_prepared`: prepared on the
/// connection, with its parameters.
pub(super) struct Step<'a> {
    pub(super) sql: &'static str,
    /// Its parameters' types (as tokio-postgres prepared it).
    pub(super) types: &'a [Type],
    pub(super) params: Vec<&'a (dyn ToSql + Sync)>,
}

/// A statement's failure as the server reported it.
#[derive(Debug)]
pub(super) struct ServerError {
    pub(super) severity: String,
    /// The SQLSTATE.
    pub(super) code: String,
    pub(super) message: String,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.severity, self.message, self.code)
    }
}

impl ServerError {
    fn parse(mut fields: ErrorFields<'_>) -> io::Result<ServerError> {
        let mut e = ServerError { severity: String::new(), code: String::new(), message: String::new() };
        while let Some(field) = fields.next()? {
            match field.type_() {
                b'S' => e.severity = String::from_utf8_lossy(field.value_bytes()).into(),
                b'C' => e.code = String::from_utf8_lossy(field.value_bytes()).into(),
                b'M' => e.message = String::from_utf8_lossy(field.value_bytes()).into(),
                _ => {}
            }
        }
        Ok(e)
    }
}

impl Driver {
    /// Sends `steps` (Bind and Execute each) with one Sync at the end, and answers each
    /// step's row count, or the first failure (the server skips what follows it until
    /// the Sync); `None` once `until` has passed. tokio-postgres ends every request
    /// with a Sync of its own, and the server flushes its answers at each Sync: a
    /// commit's six statements came back as six segments, each waking meta and
    /// contending for the socket with the next (measured: 6 sends by the server per
    /// unlink). Here they come back in one.
    ///
    /// Only between `block_on_until`s, when the connection's future is idle: it has read
    /// everything up to its last ReadyForQuery, and the server sends nothing unasked to
    /// a session that does not LISTEN (parameter changes are reported just before a
    /// ReadyForQuery), so what arrives here is the answer to these steps alone. A
    /// failure of the socket or of the protocol leaves the connection closed.
    pub(super) fn send_prepared(
        &mut self,
        steps: &[Step<'_>],
        until: Option<&dyn Fn() -> Instant>,
    ) -> io::Result<Option<Result<Vec<u64>, ServerError>>> {
        let mut out = BytesMut::new();
        // Statements not yet prepared for this path are parsed in the same pipeline.
        let mut parsing = VecDeque::new();
        for step in steps {
            let known = self
                .prepared
                .get(step.sql)
                .or_else(|| parsing.iter().find(|(sql, _)| *sql == step.sql).map(|(_, name)| name));
            let name = match known {
                Some(name) => name.clone(),
                None => {
                    self.names += 1;
                    let name = format!("locus_pipeline_{}", self.names);
                    frontend::parse(&name, step.sql, step.types.iter().map(Type::oid), &mut out)?;
                    parsing.push_back((step.sql, name.clone()));
                    name
                }
            };
            encode_step(&name, step, &mut out)?;
        }
        frontend::sync(&mut out);
        let answered = self.exchange(&out, steps.len(), &mut parsing, until);
        if answered.is_err() {
            self.connection = None;
        }
        answered
    }

    fn exchange(
        &mut self,
        mut out: &[u8],
        steps: usize,
        parsing: &mut VecDeque<(&'static str, String)>,
        until: Option<&dyn Fn() -> Instant>,
    ) -> io::Result<Option<Result<Vec<u64>, ServerError>>> {
        let mut inbox = BytesMut::with_capacity(512);
        let mut counts = Vec::with_capacity(steps);
        let mut failed = None;
        loop {
            while !out.is_empty() {
                match self.raw.io().write(out) {
                    Ok(n) => out = &out[n..],
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => break,
                    Err(e) => return Err(e),
                }
            }
            loop {
                let at = inbox.len();
                inbox.resize(at + 8192, 0);
                match self.raw.io().read(&mut inbox[at..]) {
                    Ok(0) => {
                        // A FATAL error (the session terminated) comes just before.
                        let after = failed.as_ref().map_or(String::new(), |e| format!(" after {e}"));
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the PostgreSQL server closed the connection{after}"),
                        ));
                    }
                    Ok(n) => inbox.truncate(at + n),
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                        inbox.truncate(at);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            while let Some(message) = backend::Message::parse(&mut inbox)? {
                match message {
                    backend::Message::ParseComplete => {
                        let (sql, name) = parsing.pop_front().ok_or_else(|| unexpected("an unasked ParseComplete"))?;
                        self.prepared.insert(sql, name);
                    }
                    backend::Message::BindComplete | backend::Message::DataRow(_) => {}
                    backend::Message::CommandComplete(body) => {
                        counts.push(body.tag()?.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0))
                    }
                    backend::Message::EmptyQueryResponse => counts.push(0),
                    backend::Message::ErrorResponse(body) => failed = Some(ServerError::parse(body.fields())?),
                    backend::Message::NoticeResponse(body) => {
                        // E.g. a ROLLBACK after a COMMIT that failed: "no transaction in progress".
                        tracing::debug!(notice = %ServerError::parse(body.fields())?, "PostgreSQL notice");
                    }
                    backend::Message::ParameterStatus(_) | backend::Message::NotificationResponse(_) => {}
                    backend::Message::ReadyForQuery(_) if !out.is_empty() || !inbox.is_empty() => {
                        return Err(unexpected("an answer before the whole pipeline was sent"));
                    }
                    backend::Message::ReadyForQuery(_) => {
                        return match failed {
                            Some(e) => Ok(Some(Err(e))),
                            None if counts.len() == steps => Ok(Some(Ok(counts))),
                            None => Err(unexpected("fewer answers than statements")),
                        };
                    }
                    _ => return Err(unexpected("a message no statement of the pipeline asks for")),
                }
                if counts.len() > steps {
                    return Err(unexpected("more answers than statements"));
                }
            }
            let Some(timeout) = time_left(until) else { return Ok(None) };
            wait(self.raw.fd(), !out.is_empty(), timeout)?;
        }
    }
}

/// How long a wait may last: `Some(None)` without a deadline, `None` once `until`
/// has passed.
fn time_left(until: Option<&dyn Fn() -> Instant>) -> Option<Option<Duration>> {
    match until {
        None => Some(None),
        Some(until) => match until().checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Some(Some(left)),
            _ => None,
        },
    }
}

fn unexpected(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("PostgreSQL protocol: {what}"))
}

/// Bind (binary parameters and results) and Execute of one step, prepared as
/// `name`, on the unnamed portal.
fn encode_step(name: &str, step: &Step<'_>, out: &mut BytesMut) -> io::Result<()> {
    let types = step.types;
    if types.len() != step.params.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a statement with {} parameters given {}", types.len(), step.params.len()),
        ));
    }
    let formats = step.params.iter().zip(types).map(|(p, ty)| p.encode_format(ty) as i16);
    let bound = frontend::bind(
        "",
        name,
        formats,
        step.params.iter().zip(types),
        |(param, ty), buf| match param.to_sql_checked(ty, buf)? {
            IsNull::No => Ok(postgres_protocol::IsNull::No),
            IsNull::Yes => Ok(postgres_protocol::IsNull::Yes),
        },
        Some(1),
        out,
    );
    match bound {
        Ok(()) => {}
        Err(frontend::BindError::Conversion(e)) => return Err(io::Error::new(io::ErrorKind::InvalidInput, e)),
        Err(frontend::BindError::Serialization(e)) => return Err(e),
    }
    frontend::execute("", 0, out)
}

pub(super) fn waiting(source: io::Error) -> MetaError {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A driver over one end of a socket pair whose other end plays the server.
    fn pair() -> (Driver, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (_socket, driver) = Socket::new(Stream::Unix(ours)).unwrap();
        (driver, theirs)
    }

    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// The tags of the frontend messages in `bytes`.
    fn tags(bytes: &[u8]) -> Vec<u8> {
        let mut at = 0;
        let mut tags = Vec::new();
        while at + 5 <= bytes.len() {
            tags.push(bytes[at]);
            at += 1 + i32::from_be_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        }
        assert_eq!(at, bytes.len(), "whole messages");
        tags
    }

    /// Reads what the driver sent, up to and including its Sync.
    fn read_request(server: &mut UnixStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(&[b'S', 0, 0, 0, 4]) {
            let n = server.read(&mut buf).unwrap();
            assert!(n > 0, "the driver closed before its Sync");
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    const SQL: &str = "DELETE FROM t WHERE id = $1";

    fn send(driver: &mut Driver, steps: usize) -> io::Result<Option<Result<Vec<u64>, ServerError>>> {
        let steps: Vec<Step<'_>> =
            (0..steps).map(|_| Step { sql: SQL, types: &[Type::INT8], params: vec![&5i64] }).collect();
        let until = Instant::now() + Duration::from_secs(5);
        driver.send_prepared(&steps, Some(&|| until))
    }

    #[test]
    fn a_pipeline_ends_in_one_sync_and_parses_each_statement_once() {
        let (mut driver, mut server) = pair();
        let answer = |server: &mut UnixStream, parses: usize| {
            let request = read_request(server);
            let mut reply = Vec::new();
            for _ in 0..parses {
                reply.extend(message(b'1', b""));
            }
            for n in [b"DELETE 3\0", b"DELETE 0\0"] {
                reply.extend(message(b'2', b""));
                reply.extend(message(b'C', n));
            }
            // A notice (as a ROLLBACK outside a transaction gets) is no answer.
            reply.extend(message(b'N', b"SWARNING\0C25P01\0Mthere is no transaction in progress\0\0"));
            reply.extend(message(b'Z', b"T"));
            server.write_all(&reply).unwrap();
            tags(&request)
        };
        let server_thread = std::thread::spawn(move || (answer(&mut server, 1), answer(&mut server, 0), server));
        assert_eq!(send(&mut driver, 2).unwrap().unwrap().unwrap(), vec![3, 0]);
        assert_eq!(send(&mut driver, 2).unwrap().unwrap().unwrap(), vec![3, 0]);
        let (first, second, _server) = server_thread.join().unwrap();
        // One Parse for both steps of the first pipeline, none once prepared.
        assert_eq!(first, b"PBEBES");
        assert_eq!(second, b"BEBES");
    }

    #[test]
    fn a_failure_is_the_servers_and_a_later_statement_answers_nothing() {
        let (mut driver, mut server) = pair();
        let server_thread = std::thread::spawn(move || {
            read_request(&mut server);
            let mut reply = message(b'1', b"");
            reply.extend(message(b'2', b""));
            reply.extend(message(b'E', b"SERROR\0C40001\0Mcould not serialize access\0\0"));
            reply.extend(message(b'Z', b"E"));
            server.write_all(&reply).unwrap();
            server
        });
        let failed = send(&mut driver, 2).unwrap().unwrap().unwrap_err();
        assert_eq!(failed.to_string(), "ERROR: could not serialize access (40001)");
        assert!(MetaError::from(failed).is_conflict());
        drop(server_thread.join().unwrap());
    }

    #[test]
    fn a_server_that_never_answers_runs_out_the_deadline() {
        let (mut driver, server) = pair();
        let steps = [Step { sql: SQL, types: &[Type::INT8], params: vec![&5i64] }];
        let until = Instant::now() + Duration::from_millis(100);
        assert!(driver.send_prepared(&steps, Some(&|| until)).unwrap().is_none());
        drop(server);
    }

    #[test]
    fn a_parameter_of_the_wrong_count_is_refused_before_anything_is_sent() {
        let (mut driver, _server) = pair();
        let steps = [Step { sql: SQL, types: &[Type::INT8, Type::INT8], params: vec![&5i64] }];
        let e = driver.send_prepared(&steps, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    proptest::proptest! {
        /// Whatever the server answers, the driver ends with an answer or an error,
        /// never a panic; an error leaves the connection closed.
        #[test]
        fn any_answer_ends_without_a_panic(reply in proptest::collection::vec(proptest::num::u8::ANY, 0..200), valid_prefix in 0usize..4) {
            let (mut driver, mut server) = pair();
            let server_thread = std::thread::spawn(move || {
                read_request(&mut server);
                let mut bytes: Vec<u8> = [message(b'1', b""), message(b'2', b""), message(b'C', b"DELETE 1\0")]
                    .into_iter().take(valid_prefix).flatten().collect();
                bytes.extend(reply);
                let _ = server.write_all(&bytes);
                // Then EOF: the driver must not wait for more.
            });
            let answered = send(&mut driver, 1);
            server_thread.join().unwrap();
            match answered {
                Ok(Some(_)) => {}
                Ok(None) => proptest::prop_assert!(false, "EOF ran out the deadline instead of failing"),
                Err(_) => proptest::prop_assert!(driver.connection.is_none()),
            }
        }
    }
}
