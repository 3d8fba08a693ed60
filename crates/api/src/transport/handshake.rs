//! The bytes that pass a network namespace at the start of a connection.
//!
//! The client sends [`MAGIC`] in one `sendmsg` with the namespace's descriptor as `SCM_RIGHTS`.
//! The server peeks without a control buffer (a peek leaves the descriptor queued), and only
//! when the peeked bytes are the magic does it receive them, with room for exactly one
//! descriptor. An HTTP/2 client starts with its preface (`PRI * HTTP/2.0...`), which differs
//! from the magic in the first byte.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// What a client that passes a network namespace sends first. Versioned, so that a different
/// handshake later can be told apart.
pub const MAGIC: &[u8; 16] = b"CELLIUM-NETNS-1\n";

/// What the first bytes of a connection turned out to be.
#[derive(Debug)]
pub enum Opening {
    /// The magic, received, with the namespace passed along (`None` if the client attached none).
    Netns(Option<OwnedFd>),
    /// Something else (HTTP/2's preface): left unread for the HTTP/2 server.
    Plain,
    /// The client closed the connection before sending anything.
    Closed,
}

/// Sends the magic with `netns` attached.
pub async fn send(stream: &UnixStream, netns: BorrowedFd<'_>) -> io::Result<()> {
    loop {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            let fds = [netns];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for the descriptor"));
            }
            rustix::net::sendmsg(
                stream,
                &[IoSlice::new(MAGIC)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from)
        });
        match sent {
            Ok(n) if n == MAGIC.len() => return Ok(()),
            // A 16-byte message on a fresh unix stream socket is never split; if it were, the
            // server would see a torn magic and close the connection, so say so here instead.
            Ok(n) => {
                return Err(io::Error::other(format!(
                    "sent {n} of the {} bytes that pass the network namespace",
                    MAGIC.len()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Reads how a connection opens, waiting for its first bytes.
///
/// Bytes that are a proper prefix of the magic (a client that sends it in pieces) are waited on
/// a little at a time: peeking does not consume them, so the socket stays readable. The caller
/// bounds the whole with a timeout.
pub async fn receive(stream: &UnixStream) -> io::Result<Opening> {
    loop {
        stream.readable().await?;
        let mut buf = [0u8; MAGIC.len()];
        let peeked = stream.try_io(Interest::READABLE, || {
            rustix::net::recv(stream, &mut buf[..], RecvFlags::PEEK | RecvFlags::DONTWAIT)
                .map(|(_, n)| n)
                .map_err(io::Error::from)
        });
        let n = match peeked {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(Opening::Closed);
        }
        if buf[..n] != MAGIC[..n] {
            return Ok(Opening::Plain);
        }
        if n == MAGIC.len() {
            return take_magic(stream).map(Opening::Netns);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Receives the magic (already peeked whole) and the descriptor sent with it.
fn take_magic(stream: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut buf = [0u8; MAGIC.len()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        stream.as_fd(),
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    )?;
    // Descriptors beyond the one there is room for are closed by the kernel; a client that
    // sends more is not speaking this protocol.
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::other(
            "more than one descriptor was sent with the handshake",
        ));
    }
    if msg.bytes != MAGIC.len() || buf != *MAGIC {
        return Err(io::Error::other("the handshake was torn"));
    }
    // The buffer's padding leaves room for a second descriptor: counted, not trusted.
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if fds.len() > 1 {
        return Err(io::Error::other(
            "more than one descriptor was sent with the handshake",
        ));
    }
    Ok(fds.pop())
}
