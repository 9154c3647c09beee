//! The Locus client library: an OS-neutral `Vfs` that turns POSIX-style calls into
//! metadata requests to `locus meta` and chunk transfers to the site's nodes.
//! Adapters (FUSE, the CLI) are thin layers over it; all caching and the write path
//! (buffering, chunking, write-behind) live here. `Client` (`fs`) is the path-based API
//! for programs that link the library instead of mounting (the Python package).
//!
//! Layers, each using only the ones below it: `vfs` (the POSIX calls) over `compact`
//! and `session` (workers) over `data` (nodes, placement, chunk fetch and store) over
//! `meta_link` (the session at meta).

mod compact;
mod data;
mod error;
mod file;
mod fs;
mod logins;
mod meta_link;
mod session;
mod vfs;

pub use data::LocalNode;
pub use error::VfsError;
pub use fs::{Client, Entry, OpenFile, OpenMode};
pub use meta_link::{InProcessAnswer, InProcessMeta, acting_as};
pub use vfs::{ClientConfig, DirHandle, FileHandle, InProcessMetaHandle, OpenOptions, Vfs};
