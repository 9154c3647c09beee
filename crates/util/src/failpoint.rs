//! Crash points: named places where a test can kill the process, to prove that nothing
//! acknowledged is lost whatever instant a crash hits. They are compiled in only when
//! the `fail` crate's `failpoints` feature is on, which only test builds turn on (the
//! `locus` crate's dev-dependencies); in every other build `crash_point!` is empty.
//!
//! A test arms one through the environment of the process it starts, in the `fail`
//! crate's syntax: `FAILPOINTS="chunk-before-rename=3*off->return"` lets three puts
//! through and kills the process at the fourth. The binary reads `FAILPOINTS` at start.
//!
//! The points, by the step they precede:
//! - `chunk-before-sync`: a chunk's temp file is written, not yet synced;
//! - `chunk-before-rename`: the temp file is synced, not yet renamed into place;
//! - `meta-before-commit`: a batch of metadata writes is applied, not yet committed;
//! - `meta-after-commit`: the batch is committed, nobody has been answered yet;
//! - `net-mid-bulk`: half of a frame's bulk bytes (chunk data) is sent;
//! - `replicate-before-copies`: a node stored its own copy of a chunk a `sync`/`semi-sync`
//!   put asks it to replicate (the other copies are being made at the same time);
//! - `replicate-after-copies`: every copy is made, the sender not yet answered;
//! - `move-after-hand-over`: a home move's destination meta has had the holder fence the
//!   home and pause its writes, nothing copied yet;
//! - `move-after-record`: the destination recorded the home's new place (the move's
//!   commit point), neither meta has taken it up yet;
//! - `hand-over-after-fence`: the holder fenced the home's primary, the mover not yet
//!   answered;
//! - `cross-after-prepare`: a rename or link between homes prepared the other homes'
//!   parts, its decision not yet taken (recovery rolls them back);
//! - `cross-after-decision`: its decision committed, the prepared parts not yet
//!   (recovery commits them).

pub use fail;

/// Kills the process here if the test configuration arms `$name` (see the module doc).
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        $crate::failpoint::fail::fail_point!($name, |_| $crate::failpoint::crash($name))
    };
}

/// Ends the process at once with SIGKILL, as `kill -9` would: no destructor, no flush,
/// no reply to anyone.
pub fn crash(name: &str) -> ! {
    eprintln!("crash point {name} reached: killing the process");
    // SAFETY: kill(2) on our own pid with a valid signal number has no memory effects.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    loop {
        std::thread::park();
    }
}
