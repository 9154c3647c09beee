//! The Locus client library: an OS-neutral `Vfs` that turns POSIX-style calls into
//! metadata requests to `locus meta` and chunk transfers to the site's nodes.
//! Adapters (FUSE, the CLI) are thin layers over it; all caching and the write path
//! (buffering, chunking, write-behind) live here.

mod compact;
mod error;
mod file;
mod vfs;

pub use error::VfsError;
pub use vfs::{ClientConfig, DirHandle, FileHandle, OpenOptions, Vfs};
