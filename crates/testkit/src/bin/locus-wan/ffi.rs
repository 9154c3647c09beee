//! The raw system calls of the forwarder (AF_PACKET sockets, signals, ppoll, the
//! monotonic clock), each wrapped once so the rest of the binary is safe code.

use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const SO_RCVBUFFORCE: libc::c_int = 33;
const SO_SNDBUFFORCE: libc::c_int = 32;

/// Set by SIGTERM, SIGINT or SIGHUP; the loops stop at their next wake-up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Whether a stop signal has arrived.
pub fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// CLOCK_MONOTONIC in nanoseconds: the time base of every pipeline.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Asks the kernel for 1 µs timer slack, so ppoll wakes close to a frame's due time.
pub fn set_fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
}

/// The signal mask to wait with: installs the stop handler for SIGTERM, SIGINT and
/// SIGHUP and blocks them everywhere except inside [`wait`], so a stop request that
/// arrives between two checks of [`stopping`] is delivered at the next wait, not lost.
pub fn install_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: every sigset_t and sigaction is zero-initialised (a valid state for
    // these plain C structs) and then set up with the libc calls made for them; the
    // handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut block, s);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(s, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        if libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Inside ppoll, the original mask minus our signals' block applies.
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigdelset(&mut old, s);
        }
        Ok(old)
    }
}

/// ppoll on `fds` for at most `wait_ns`, with the stop signals unblocked meanwhile.
/// Returns the number of ready descriptors (0 on timeout or signal).
pub fn wait(fds: &mut [libc::pollfd], wait_ns: u64, mask: &libc::sigset_t) -> io::Result<usize> {
    let ts = libc::timespec { tv_sec: (wait_ns / 1_000_000_000) as i64, tv_nsec: (wait_ns % 1_000_000_000) as i64 };
    for f in fds.iter_mut() {
        f.revents = 0;
    }
    // SAFETY: `fds` is a valid slice of pollfd of the length passed; `ts` and `mask`
    // are valid for reading for the duration of the call.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, mask) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(r as usize)
}

/// One interface of the switch: an AF_PACKET socket bound to it.
pub struct Port {
    /// The interface name.
    pub name: String,
    /// The socket (owned: closed on drop).
    pub fd: libc::c_int,
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: `fd` was opened by `Port::open` and is owned by this Port alone.
        unsafe { libc::close(self.fd) };
    }
}

fn setsockopt_int(fd: libc::c_int, level: libc::c_int, opt: libc::c_int, val: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value points to a live c_int and the length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &val as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

impl Port {
    /// An AF_PACKET socket bound to `name`, seeing every frame the interface receives
    /// but none it sends.
    pub fn open(name: &str) -> io::Result<Port> {
        let cname = CString::new(name).map_err(|_| io::Error::other("bad interface name"))?;
        // SAFETY: `cname` is a NUL-terminated string that outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::other(format!("no interface {name}")));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: socket() takes only integers; the returned fd is checked below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as libc::c_int) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let port = Port { name: name.to_string(), fd };
        setsockopt_int(fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)?;
        setsockopt_int(fd, libc::SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)?;
        setsockopt_int(fd, libc::SOL_SOCKET, SO_SNDBUFFORCE, 8 << 20)?;
        // SAFETY: sockaddr_ll is a plain C struct for which all zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a live sockaddr_ll and the length passed is its size.
        let r = unsafe {
            libc::bind(
                fd,
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // Frames that arrived before the bind may belong to no port: drain them.
        let mut scratch = [0u8; 256];
        while port.recv(&mut scratch).is_some_and(|n| n > 0) {}
        Ok(port)
    }

    /// Reads one frame without blocking into `buf`; returns its full length (which
    /// exceeds `buf.len()` for a truncated frame), or `None` when nothing is queued.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes; MSG_TRUNC makes the
        // kernel report the frame's length without writing past `buf.len()`.
        let r =
            unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
        (r >= 0).then_some(r as usize)
    }

    /// Sends one frame without blocking; false if the kernel refused it.
    pub fn send(&self, frame: &[u8]) -> bool {
        // SAFETY: `frame` is valid for reads of `frame.len()` bytes.
        let r = unsafe { libc::send(self.fd, frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT) };
        r >= 0
    }
}
