//! Flows kept open across policy changes: a TCP connection or a connected UDP socket, opened
//! from inside a pod to a server of the lab, on which a round trip can be asked at any time.
//!
//! Both keep their 5-tuple for their whole life, so the datapath decides them once (their
//! first packet) and follows conntrack afterwards; a later round trip tells whether an
//! established flow still flows after the policy changed.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::netns::NetNs;
use crate::reach::Outcome;

/// How long a round trip may take.
const ROUND_TRIP: Duration = Duration::from_millis(1500);

/// An open flow; see the module docs.
#[derive(Debug)]
pub enum OpenFlow {
    /// A TCP connection to a [`TcpServer`](crate::probe::TcpServer) (which echoes).
    Tcp {
        /// The connection.
        stream: TcpStream,
        /// Its reader (the banner is read already).
        reader: BufReader<TcpStream>,
    },
    /// A connected UDP socket to a [`UdpServer`](crate::probe::UdpServer) (which answers).
    Udp(UdpSocket),
}

fn probe_err(probe: &'static str, dst: SocketAddr) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Probe {
        probe,
        target: dst.to_string(),
        source,
    }
}

impl OpenFlow {
    /// Connects from `ns` to `dst` (IPv4 or IPv6) and reads the server's banner.
    pub fn tcp(ns: &NetNs, dst: impl Into<SocketAddr>) -> Result<OpenFlow> {
        let dst = dst.into();
        let stream = ns
            .run(move || TcpStream::connect_timeout(&dst, ROUND_TRIP))?
            .map_err(probe_err("tcp connect", dst))?;
        let setup = || -> std::io::Result<OpenFlow> {
            stream.set_read_timeout(Some(ROUND_TRIP))?;
            stream.set_write_timeout(Some(ROUND_TRIP))?;
            let mut reader = BufReader::new(stream.try_clone()?);
            let mut banner = String::new();
            reader.read_line(&mut banner)?;
            Ok(OpenFlow::Tcp { stream, reader })
        };
        setup().map_err(probe_err("tcp banner", dst))
    }

    /// Opens a UDP socket in `ns` connected to `dst` and makes a first round trip, which
    /// must succeed: it is what puts the flow into conntrack.
    pub fn udp(ns: &NetNs, dst: impl Into<SocketAddr>) -> Result<OpenFlow> {
        let dst = dst.into();
        let sock = ns
            .run(move || -> std::io::Result<UdpSocket> {
                let any = if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
                let sock = UdpSocket::bind(any)?;
                sock.connect(dst)?;
                sock.set_read_timeout(Some(ROUND_TRIP))?;
                Ok(sock)
            })?
            .map_err(probe_err("udp connect", dst))?;
        let mut flow = OpenFlow::Udp(sock);
        match flow.round_trip() {
            Outcome::Answered => Ok(flow),
            other => Err(Error::Unexpected {
                what: "first udp round trip",
                detail: format!("to {dst}: {other}"),
            }),
        }
    }

    /// One message and its answer on the open flow.
    pub fn round_trip(&mut self) -> Outcome {
        let result = match self {
            OpenFlow::Tcp { stream, reader } => (|| -> std::io::Result<bool> {
                stream.write_all(b"still open?")?;
                let mut echo = [0u8; 11];
                reader.read_exact(&mut echo)?;
                Ok(&echo == b"still open?")
            })(),
            OpenFlow::Udp(sock) => (|| -> std::io::Result<bool> {
                sock.send(b"still open?")?;
                let mut buf = [0u8; 256];
                let n = sock.recv(&mut buf)?;
                Ok(buf[..n].ends_with(b":still open?"))
            })(),
        };
        match result {
            Ok(true) => Outcome::Answered,
            Ok(false) => Outcome::Failed("unexpected answer".into()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Outcome::Dropped
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset
                ) =>
            {
                Outcome::Refused
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}
