//! The NBD wire protocol (newstyle fixed handshake, simple and structured replies), as
//! the protocol document of the NBD project defines it. Decoding outside bytes returns
//! an error and never panics or allocates from a length it was sent (fuzzed).

use crate::NbdError;

/// "NBDMAGIC", the greeting's first word.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the newstyle greeting's second word, and the start of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Starts every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags the server sends, and the client's flags it answers with.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1;
pub const CLIENT_NO_ZEROES: u32 = 2;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
const REP_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR | 6;

/// Information items of `NBD_REP_INFO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TX_HAS_FLAGS: u16 = 1;
pub const TX_READ_ONLY: u16 = 1 << 1;
pub const TX_SEND_FLUSH: u16 = 1 << 2;
pub const TX_SEND_FUA: u16 = 1 << 3;
pub const TX_SEND_TRIM: u16 = 1 << 5;
pub const TX_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TX_CAN_MULTI_CONN: u16 = 1 << 8;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1;

/// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// The errors a reply may carry (the protocol's own numbers, Linux's values).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;

/// Longest option payload accepted (an export name is at most 4096 bytes; the rest
/// of INFO/GO is small).
pub const MAX_OPTION_LEN: u32 = 8192;

/// Bytes of a request header.
pub const REQUEST_LEN: usize = 28;

/// A command of the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disconnect,
    Flush,
    Trim,
    WriteZeroes,
    /// A command this server does not implement (answered with EINVAL).
    Other(u16),
}

impl Command {
    fn from_wire(t: u16) -> Command {
        match t {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disconnect,
            3 => Command::Flush,
            4 => Command::Trim,
            6 => Command::WriteZeroes,
            other => Command::Other(other),
        }
    }
}

/// A request header (a WRITE's data follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Decodes a request header; a wrong magic is an error (the stream is lost).
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, NbdError> {
        let magic = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != REQUEST_MAGIC {
            return Err(NbdError::Protocol(format!("request magic {magic:#x}, not {REQUEST_MAGIC:#x}")));
        }
        Ok(Request {
            flags: u16::from_be_bytes(b[4..6].try_into().expect("2 bytes")),
            command: Command::from_wire(u16::from_be_bytes(b[6..8].try_into().expect("2 bytes"))),
            cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
            length: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
        })
    }

    /// The header as a client sends it (tests and fuzzing build requests with it).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let kind = match self.command {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disconnect => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::WriteZeroes => 6,
            Command::Other(t) => t,
        };
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// What an `NBD_OPT_INFO` or `NBD_OPT_GO` asks for: an export and information items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub items: Vec<u16>,
}

impl InfoRequest {
    /// Parses the option's data: a u32 name length, the name, a u16 count of items
    /// and the items. Every length is checked against the data actually sent.
    pub fn decode(data: &[u8]) -> Result<InfoRequest, NbdError> {
        let bad = |what: &str| NbdError::Protocol(format!("INFO/GO option: {what}"));
        let len = data.get(0..4).ok_or_else(|| bad("shorter than its name length"))?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let name = data.get(4..4usize.saturating_add(len)).ok_or_else(|| bad("name longer than the option"))?;
        let rest = &data[4 + len..];
        let count = rest.get(0..2).ok_or_else(|| bad("no count of information requests"))?;
        let count = u16::from_be_bytes(count.try_into().expect("2 bytes")) as usize;
        let items = &rest[2..];
        if items.len() != count * 2 {
            return Err(bad(&format!("{count} information requests in {} bytes", items.len())));
        }
        Ok(InfoRequest {
            name: export_name(name)?,
            items: items.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect(),
        })
    }
}

/// An export name as sent: UTF-8, as the protocol requires.
pub fn export_name(bytes: &[u8]) -> Result<String, NbdError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| NbdError::Protocol("an export name that is not UTF-8".into()))
}

/// An option reply: header and data.
pub fn option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// A simple reply's header (a READ's data follows it).
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk's header for `payload_len` bytes of payload.
pub fn structured_reply(flags: u16, kind: u16, cookie: u64, payload_len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&payload_len.to_be_bytes());
    b
}

/// The payload of a structured error chunk: the error and a message for people.
pub fn error_payload(error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(4096)];
    let mut out = Vec::with_capacity(6 + message.len());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The protocol's error for an errno (it knows only a few; the rest are EIO).
pub fn nbd_errno(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EACCES | libc::EROFS => EPERM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::EOPNOTSUPP => ENOTSUP,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_request_survives_the_wire() {
        let r = Request { flags: CMD_FLAG_FUA, command: Command::Write, cookie: 7, offset: 4096, length: 512 };
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert!(Request::decode(&bad).is_err());
    }

    #[test]
    fn info_requests_are_checked_against_their_length() {
        let mut data = 3u32.to_be_bytes().to_vec();
        data.extend_from_slice(b"vm1");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        let info = InfoRequest::decode(&data).unwrap();
        assert_eq!(info, InfoRequest { name: "vm1".into(), items: vec![INFO_BLOCK_SIZE, INFO_NAME] });
        assert!(InfoRequest::decode(&data[..data.len() - 1]).is_err());
        let mut huge = u32::MAX.to_be_bytes().to_vec();
        huge.extend_from_slice(b"x");
        assert!(InfoRequest::decode(&huge).is_err());
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = InfoRequest::decode(&bytes);
            let mut header = [0u8; REQUEST_LEN];
            let n = bytes.len().min(REQUEST_LEN);
            header[..n].copy_from_slice(&bytes[..n]);
            let _ = Request::decode(&header);
        }
    }
}
