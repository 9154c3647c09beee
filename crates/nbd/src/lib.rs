//! Locus files as network block devices: an NBD server (the newstyle fixed handshake,
//! export listing, INFO/GO, structured replies, STARTTLS) over `client::OpenFile`, so
//! a block device gets the file path's site-local data, replication policies, chunk
//! store and durability. Like `fuse`, it translates and holds no file-system logic.
//!
//! Every connection reads and writes through an open file of its own (its own read-ahead
//! for its own stream), reopened from the export's: the writes of all of them are the
//! file's, so a FLUSH on any connection commits what every connection wrote, which is
//! what `NBD_FLAG_CAN_MULTI_CONN` promises. Writes are buffered like a disk's volatile
//! cache until a FLUSH or a FUA write, which commit them under the file's replication
//! policy.

pub mod wire;

use bytes::Bytes;
use client::{OpenFile, VfsError};
use proto::meta::AllocateMode;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinSet;
use wire::*;

/// Largest READ or WRITE payload (advertised as the maximum block size): bounds what
/// one request can make the server hold.
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// Requests of one connection executed at once (more wait to be read).
const IN_FLIGHT: usize = 64;

/// Bytes of READ and WRITE payloads held at once by all connections together: bounds
/// the memory clients can make the server hold (a request waits for its share before
/// its payload is read).
const PAYLOAD_BUDGET: usize = 256 << 20;

/// Connections served at once; more are closed on arrival.
const MAX_CONNECTIONS: usize = 256;

/// How long a stopping server waits for its connections to finish the requests they
/// have read (none is cut off halfway: a write the client was told of stays whole)
/// before it drops what is left.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Longest handshake (greeting to GO): a client that stalls in it is dropped.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// The client broke the protocol; the connection is closed.
    #[error("NBD protocol: {0}")]
    Protocol(String),
    #[error("NBD connection: {0}")]
    Io(#[from] std::io::Error),
}

type Result<T> = std::result::Result<T, NbdError>;

/// One Locus file served as a block device.
pub struct Export {
    /// The name clients ask for.
    pub name: String,
    /// Shown by export listings (`nbdinfo --list`): the file's path.
    pub description: String,
    /// The file, opened for reading (and writing unless `read_only`); it holds the
    /// export's lock, and each connection reopens it.
    pub file: OpenFile,
    /// The device's size, fixed while it is served.
    pub size: u64,
    pub read_only: bool,
}

impl Export {
    fn transmission_flags(&self) -> u16 {
        let mut flags = TX_HAS_FLAGS | TX_SEND_FLUSH | TX_SEND_FUA | TX_CAN_MULTI_CONN;
        if self.read_only {
            flags |= TX_READ_ONLY;
        } else {
            flags |= TX_SEND_TRIM | TX_SEND_WRITE_ZEROES;
        }
        flags
    }

    /// Runs one command through `file` (the connection's open file of the export);
    /// `Some` bytes for a READ.
    async fn execute(
        &self,
        file: &OpenFile,
        req: &Request,
        data: Option<Vec<u8>>,
    ) -> std::result::Result<Option<Bytes>, (u32, String)> {
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let writes = matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
        if writes && self.read_only {
            return Err((EPERM, format!("export {} is read-only", self.name)));
        }
        if !matches!(req.command, Command::Flush | Command::Other(_)) {
            let end = req.offset.checked_add(u64::from(req.length));
            if end.is_none_or(|end| end > self.size) {
                let error = if writes { ENOSPC } else { EINVAL };
                let what = format!("{} bytes at {} beyond the end ({})", req.length, req.offset, self.size);
                return Err((error, what));
            }
        }
        let failed = |e: VfsError| (nbd_errno(e.errno()), e.to_string());
        match req.command {
            Command::Read => {
                if req.length > MAX_PAYLOAD {
                    return Err((EOVERFLOW, format!("a read of {} bytes (at most {MAX_PAYLOAD})", req.length)));
                }
                let bytes = file.read_at(req.offset, req.length as usize).await.map_err(failed)?;
                if bytes.len() == req.length as usize {
                    return Ok(Some(bytes));
                }
                // Past what meta knows of the file (another site shrank it): zeros, as a hole.
                let mut padded = bytes.to_vec();
                padded.resize(req.length as usize, 0);
                return Ok(Some(Bytes::from(padded)));
            }
            Command::Write => {
                file.write_at(req.offset, &data.unwrap_or_default()).await.map_err(failed)?;
            }
            Command::Trim | Command::WriteZeroes if req.length > 0 => {
                let (offset, len) = (req.offset, u64::from(req.length));
                file.allocate(offset, len, AllocateMode::PunchHole).await.map_err(failed)?;
            }
            Command::Trim | Command::WriteZeroes => {}
            Command::Flush => return file.fsync().await.map(|()| None).map_err(failed),
            Command::Disconnect => {}
            Command::Other(kind) => return Err((EINVAL, format!("command {kind} is not supported"))),
        }
        if fua {
            file.fsync().await.map_err(failed)?;
        }
        Ok(None)
    }
}

/// What a client's options ended in.
enum Negotiated {
    StartTls,
    Abort,
    Go { export: Arc<Export>, structured: bool },
}

/// A byte stream a connection runs over: TCP, or TLS over it after STARTTLS.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// The NBD server: its exports and, unless it serves plain TCP, the TLS every client
/// must start before it may see them.
pub struct Server {
    exports: Vec<Arc<Export>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// `PAYLOAD_BUDGET`, in bytes.
    payload: Arc<Semaphore>,
    /// Set when the server stops: connections read no further request.
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Server {
    /// `tls`: the configuration clients must STARTTLS into (`None`: plain, which the
    /// binary allows only on loopback).
    pub fn new(exports: Vec<Export>, tls: Option<Arc<rustls::ServerConfig>>) -> Server {
        Server {
            exports: exports.into_iter().map(Arc::new).collect(),
            tls: tls.map(tokio_rustls::TlsAcceptor::from),
            payload: Arc::new(Semaphore::new(PAYLOAD_BUDGET)),
            stopping: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Accepts clients until `stop` resolves; then every connection finishes the
    /// requests it has read, reads no more and commits what it wrote (those still in
    /// their handshake, or stuck, are dropped after `STOP_GRACE`).
    pub async fn serve(self: Arc<Self>, listener: TcpListener, stop: impl std::future::Future<Output = ()>) {
        let mut connections = JoinSet::new();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok((tcp, peer)) if connections.len() >= MAX_CONNECTIONS => {
                        tracing::warn!("nbd: refusing {peer}: {MAX_CONNECTIONS} connections are open");
                        drop(tcp);
                    }
                    Ok((tcp, peer)) => {
                        let server = self.clone();
                        connections.spawn(async move { server.connection(tcp, peer).await });
                    }
                    Err(e) => {
                        tracing::warn!("nbd: accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        drop(listener);
        self.stopping.send_replace(true);
        let finished = tokio::time::timeout(STOP_GRACE, async { while connections.join_next().await.is_some() {} });
        if finished.await.is_err() {
            tracing::warn!("nbd: {} connections did not end within {STOP_GRACE:?}: dropped", connections.len());
            connections.abort_all();
            while connections.join_next().await.is_some() {}
        }
    }

    /// The exports, to commit and close when the server stops.
    pub fn exports(&self) -> Vec<Arc<Export>> {
        self.exports.clone()
    }

    async fn connection(self: Arc<Self>, tcp: TcpStream, peer: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        let ended = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.handshake(tcp)).await {
            Err(_) => Err(NbdError::Protocol(format!("no export chosen within {HANDSHAKE_TIMEOUT:?}"))),
            Ok(Err(e)) => Err(e),
            Ok(Ok(None)) => Ok(()),
            Ok(Ok(Some((stream, export, structured)))) => {
                transmit(stream, export, structured, self.payload.clone(), self.stopping.subscribe()).await
            }
        };
        match ended {
            Ok(()) => tracing::debug!("nbd: {peer} disconnected"),
            Err(e) => tracing::warn!("nbd: {peer}: {e}"),
        }
    }

    /// The handshake up to the export the client chose (`None`: it aborted).
    async fn handshake(&self, mut tcp: TcpStream) -> Result<Option<(Box<dyn Stream>, Arc<Export>, bool)>> {
        let mut greeting = Vec::with_capacity(18);
        greeting.extend_from_slice(&NBD_MAGIC.to_be_bytes());
        greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
        greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        tcp.write_all(&greeting).await?;
        let flags = tcp.read_u32().await?;
        if flags & CLIENT_FIXED_NEWSTYLE == 0 {
            return Err(NbdError::Protocol("the client does not speak the fixed newstyle handshake".into()));
        }
        let no_zeroes = flags & CLIENT_NO_ZEROES != 0;
        let mut stream: Box<dyn Stream> = Box::new(tcp);
        let mut secured = false;
        loop {
            match self.negotiate(&mut stream, secured, no_zeroes).await? {
                Negotiated::Abort => return Ok(None),
                Negotiated::StartTls => {
                    let acceptor = self.tls.clone().expect("STARTTLS is accepted only with TLS");
                    let tls = acceptor
                        .accept(stream)
                        .await
                        .map_err(|e| NbdError::Protocol(format!("TLS handshake failed: {e}")))?;
                    stream = Box::new(tls);
                    secured = true;
                }
                Negotiated::Go { export, structured } => return Ok(Some((stream, export, structured))),
            }
        }
    }

    fn find(&self, name: &str) -> Option<Arc<Export>> {
        // The empty name is the default export when there is only one.
        let only = (name.is_empty() && self.exports.len() == 1).then(|| self.exports[0].clone());
        only.or_else(|| self.exports.iter().find(|e| e.name == name).cloned())
    }

    /// The option haggling phase; after STARTTLS it starts afresh over TLS.
    async fn negotiate(&self, s: &mut Box<dyn Stream>, secured: bool, no_zeroes: bool) -> Result<Negotiated> {
        let mut structured = false;
        loop {
            let magic = s.read_u64().await?;
            if magic != IHAVEOPT {
                return Err(NbdError::Protocol(format!("option magic {magic:#x}, not IHAVEOPT")));
            }
            let option = s.read_u32().await?;
            let len = s.read_u32().await?;
            if len > MAX_OPTION_LEN {
                return Err(NbdError::Protocol(format!("option {option} of {len} bytes (at most {MAX_OPTION_LEN})")));
            }
            let mut data = vec![0u8; len as usize];
            s.read_exact(&mut data).await?;
            let reply = |kind: u32, data: &[u8]| option_reply(option, kind, data);
            let refuse = |kind: u32, why: &str| option_reply(option, kind, why.as_bytes());
            let out = match option {
                OPT_ABORT => {
                    let _ = s.write_all(&reply(REP_ACK, &[])).await;
                    let _ = s.flush().await;
                    return Ok(Negotiated::Abort);
                }
                OPT_STARTTLS if secured => refuse(REP_ERR_INVALID, "TLS is already on"),
                OPT_STARTTLS if self.tls.is_none() => refuse(REP_ERR_POLICY, "this server serves plain NBD (loopback)"),
                OPT_STARTTLS if len > 0 => refuse(REP_ERR_INVALID, "STARTTLS carries no data"),
                OPT_STARTTLS => {
                    s.write_all(&reply(REP_ACK, &[])).await?;
                    s.flush().await?;
                    return Ok(Negotiated::StartTls);
                }
                OPT_EXPORT_NAME if self.tls.is_some() && !secured => {
                    return Err(NbdError::Protocol("EXPORT_NAME before STARTTLS: this server requires TLS".into()));
                }
                _ if self.tls.is_some() && !secured => refuse(REP_ERR_TLS_REQD, "this server requires TLS (STARTTLS)"),
                OPT_EXPORT_NAME => {
                    let name = export_name(&data)?;
                    let Some(export) = self.find(&name) else {
                        return Err(NbdError::Protocol(format!("no export named {name:?}")));
                    };
                    let mut out = export.size.to_be_bytes().to_vec();
                    out.extend_from_slice(&export.transmission_flags().to_be_bytes());
                    if !no_zeroes {
                        out.extend_from_slice(&[0u8; 124]);
                    }
                    s.write_all(&out).await?;
                    s.flush().await?;
                    return Ok(Negotiated::Go { export, structured });
                }
                OPT_LIST if len > 0 => refuse(REP_ERR_INVALID, "LIST carries no data"),
                OPT_LIST => {
                    let mut out = Vec::new();
                    for e in &self.exports {
                        let mut item = (e.name.len() as u32).to_be_bytes().to_vec();
                        item.extend_from_slice(e.name.as_bytes());
                        item.extend_from_slice(e.description.as_bytes());
                        out.extend(reply(REP_SERVER, &item));
                    }
                    out.extend(reply(REP_ACK, &[]));
                    out
                }
                OPT_STRUCTURED_REPLY if len > 0 => refuse(REP_ERR_INVALID, "STRUCTURED_REPLY carries no data"),
                OPT_STRUCTURED_REPLY => {
                    structured = true;
                    reply(REP_ACK, &[])
                }
                OPT_INFO | OPT_GO => match InfoRequest::decode(&data) {
                    Err(e) => refuse(REP_ERR_INVALID, &e.to_string()),
                    Ok(info) => match self.find(&info.name) {
                        None => refuse(REP_ERR_UNKNOWN, &format!("no export named {:?}", info.name)),
                        Some(export) => {
                            let mut out = Vec::new();
                            let mut item = INFO_EXPORT.to_be_bytes().to_vec();
                            item.extend_from_slice(&export.size.to_be_bytes());
                            item.extend_from_slice(&export.transmission_flags().to_be_bytes());
                            out.extend(reply(REP_INFO, &item));
                            for asked in &info.items {
                                let mut item = asked.to_be_bytes().to_vec();
                                match *asked {
                                    INFO_NAME => item.extend_from_slice(export.name.as_bytes()),
                                    INFO_DESCRIPTION => item.extend_from_slice(export.description.as_bytes()),
                                    INFO_BLOCK_SIZE => {
                                        for size in [1u32, 4096, MAX_PAYLOAD] {
                                            item.extend_from_slice(&size.to_be_bytes());
                                        }
                                    }
                                    _ => continue,
                                }
                                out.extend(reply(REP_INFO, &item));
                            }
                            out.extend(reply(REP_ACK, &[]));
                            if option == OPT_GO {
                                s.write_all(&out).await?;
                                s.flush().await?;
                                return Ok(Negotiated::Go { export, structured });
                            }
                            out
                        }
                    },
                },
                _ => refuse(REP_ERR_UNSUP, &format!("option {option} is not supported")),
            };
            s.write_all(&out).await?;
            s.flush().await?;
        }
    }
}

/// The transmission phase: requests are read in order and executed at once (up to
/// `IN_FLIGHT`, their payloads within the server's `payload` budget); replies go out as
/// each finishes, matched by cookie.
async fn transmit(
    stream: Box<dyn Stream>,
    export: Arc<Export>,
    structured: bool,
    payload: Arc<Semaphore>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let opened = export.file.reopen().await;
    let file = Arc::new(opened.map_err(|e| std::io::Error::other(format!("opening {}: {e}", export.description)))?);
    let (mut requests, replies) = tokio::io::split(stream);
    let replies = Arc::new(Mutex::new(replies));
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut running = JoinSet::new();
    let ended = loop {
        let mut header = [0u8; REQUEST_LEN];
        let read = tokio::select! {
            read = requests.read_exact(&mut header) => read,
            _ = stopping.wait_for(|stop| *stop) => break Ok(()),
        };
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e.into()),
        }
        let req = match Request::decode(&header) {
            Ok(req) => req,
            Err(e) => break Err(e),
        };
        if req.command == Command::Disconnect {
            break Ok(());
        }
        if req.command == Command::Write && req.length > MAX_PAYLOAD {
            break Err(NbdError::Protocol(format!("a write of {} bytes (at most {MAX_PAYLOAD})", req.length)));
        }
        let permit = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        let bytes = match req.command {
            Command::Read | Command::Write => req.length.min(MAX_PAYLOAD),
            _ => 0,
        };
        let held = payload.clone().acquire_many_owned(bytes).await.expect("the semaphore is never closed");
        let data = if req.command == Command::Write {
            let mut data = vec![0u8; req.length as usize];
            if let Err(e) = requests.read_exact(&mut data).await {
                break Err(e.into());
            }
            Some(data)
        } else {
            None
        };
        let (export, file, replies) = (export.clone(), file.clone(), replies.clone());
        running.spawn(async move {
            let result = export.execute(&file, &req, data).await;
            let sent = reply(&replies, &req, result, structured).await;
            drop((permit, held));
            sent
        });
        while let Some(done) = running.try_join_next() {
            if let Ok(Err(e)) = done {
                tracing::debug!("nbd: a reply could not be sent: {e}");
            }
        }
    };
    while running.join_next().await.is_some() {}
    // What the client wrote and did not flush is committed now that it has gone (made
    // visible to other clients of the file; durable at the next FLUSH or fsync).
    if let Some(mut file) = Arc::into_inner(file)
        && let Err(e) = file.close().await
    {
        tracing::warn!("nbd: committing export {} after a client left: {e}", export.name);
    }
    ended
}

/// Sends the reply to one request: simple, or a structured chunk for a READ when the
/// client asked for structured replies.
async fn reply(
    to: &Mutex<tokio::io::WriteHalf<Box<dyn Stream>>>,
    req: &Request,
    result: std::result::Result<Option<Bytes>, (u32, String)>,
    structured: bool,
) -> Result<()> {
    let (head, body) = match (result, structured && req.command == Command::Read) {
        (Ok(data), false) => (simple_reply(0, req.cookie).to_vec(), data),
        (Err((error, why)), false) => {
            tracing::debug!("nbd: {:?} at {}: {why}", req.command, req.offset);
            (simple_reply(error, req.cookie).to_vec(), None)
        }
        (Ok(Some(data)), true) if !data.is_empty() => {
            let len = u32::try_from(8 + data.len()).expect("a read is at most MAX_PAYLOAD");
            let mut head = structured_reply(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, req.cookie, len).to_vec();
            head.extend_from_slice(&req.offset.to_be_bytes());
            (head, Some(data))
        }
        (Ok(_), true) => (structured_reply(REPLY_FLAG_DONE, REPLY_TYPE_NONE, req.cookie, 0).to_vec(), None),
        (Err((error, why)), true) => {
            let payload = error_payload(error, &why);
            let mut head =
                structured_reply(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, req.cookie, payload.len() as u32).to_vec();
            head.extend_from_slice(&payload);
            (head, None)
        }
    };
    let mut out = to.lock().await;
    match body {
        Some(body) if body.len() <= 64 << 10 => {
            let mut all = head;
            all.extend_from_slice(&body);
            out.write_all(&all).await?;
        }
        Some(body) => {
            out.write_all(&head).await?;
            out.write_all(&body).await?;
        }
        None => out.write_all(&head).await?,
    }
    out.flush().await?;
    Ok(())
}
