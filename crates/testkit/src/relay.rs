//! A TCP relay for tests that stand between two processes: to see what a man in the
//! middle sees (the TLS tests), or to deliver bytes as a slow network may (the
//! PostgreSQL tests). Each direction of each relayed connection reads on its own
//! thread and hands what it read to a `Pass` made for it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

/// Which way bytes cross the relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the side that connected to the relay towards `upstream`.
    Up,
    /// From `upstream` back.
    Down,
}

/// What one direction of one connection does with each read: it writes what it passes
/// on to the stream (all of it, part of it now and the rest later, after a pause...).
/// An error ends that direction.
pub type Pass = Box<dyn FnMut(&[u8], &mut TcpStream) -> std::io::Result<()> + Send>;

/// Listens on a free port of 127.0.0.1 and relays every connection to `upstream`, each
/// direction through the `Pass` that `pass_for` makes for it. Returns the address to
/// connect to instead of `upstream`.
pub fn relay(upstream: String, pass_for: impl Fn(Direction) -> Pass + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("the relay's address").to_string();
    std::thread::spawn(move || {
        for inbound in listener.incoming().map_while(Result::ok) {
            let Ok(outbound) = TcpStream::connect(&upstream) else { continue };
            let (Ok(inbound_copy), Ok(outbound_copy)) = (inbound.try_clone(), outbound.try_clone()) else { continue };
            for (direction, from, into) in
                [(Direction::Up, inbound_copy, outbound_copy), (Direction::Down, outbound, inbound)]
            {
                let pass = pass_for(direction);
                std::thread::spawn(move || pump(from, into, pass));
            }
        }
    });
    addr
}

/// A `Pass` that hands every byte on as it came.
pub fn forward() -> Pass {
    Box::new(|bytes, out| out.write_all(bytes))
}

fn pump(mut from: TcpStream, mut into: TcpStream, mut pass: Pass) {
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if pass(&buf[..n], &mut into).is_err() {
            break;
        }
    }
    // The other side sees the end of this direction; the other direction runs on.
    let _ = into.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn relays_both_ways_through_each_directions_pass() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = server.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got.repeat(2)).unwrap();
        });
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        let addr = relay(upstream, move |direction| {
            if direction == Direction::Up {
                return forward();
            }
            let kept = kept.clone();
            Box::new(move |bytes, out| {
                kept.lock().unwrap().extend_from_slice(bytes);
                out.write_all(&bytes.to_ascii_uppercase())
            })
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"ping").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"PINGPING");
        assert_eq!(*seen.lock().unwrap(), b"pingping");
    }
}
