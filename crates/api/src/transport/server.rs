//! The server's side: accepting connections and reading how each opens.

use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::unix::UCred;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use super::handshake::{self, Opening};

/// How long a new connection may take to send its first bytes. Clients send them at once (the
/// handshake, or HTTP/2's preface); one that does not is closed when this expires, and never
/// holds up other connections, whose openings are read side by side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who is at the other end of a connection, as request extensions carry it:
/// `request.extensions().get::<Peer>()`.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The peer's process, user and group when it connected (`SO_PEERCRED`), if the kernel said.
    pub credentials: Option<UCred>,
    /// The network namespace the peer passed when it connected, if it passed one.
    pub netns: Option<Arc<OwnedFd>>,
}

impl Peer {
    /// The peer of the connection `request` came on; `None` outside [`incoming`]'s connections.
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&Peer> {
        request.extensions().get::<Peer>()
    }
}

/// An accepted connection whose opening has been read.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    peer: Peer,
}

impl Connection {
    /// The peer.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }
}

impl Connected for Connection {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections of `listener`, each with its opening read (within `timeout`), for
/// `tonic::transport::Server::serve_with_incoming*`.
///
/// Accepting runs on a task of its own and each opening is read on a task of its own, so a
/// client that connects and says nothing delays nobody. The task ends, and the listener closes,
/// when the returned stream is dropped (the server stopped).
pub fn incoming(
    listener: UnixListener,
    timeout: Duration,
) -> ReceiverStream<io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, timeout, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: UnixListener,
    timeout: Duration,
    tx: mpsc::Sender<io::Result<Connection>>,
) {
    loop {
        let accepted = tokio::select! {
            () = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                tokio::spawn(open(stream, timeout, tx.clone()));
            }
            Err(e) => {
                // Out of descriptors, say: accepting again at once would spin.
                tracing::warn!(error = %e, "accepting an API connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn open(stream: UnixStream, timeout: Duration, tx: mpsc::Sender<io::Result<Connection>>) {
    let netns = match tokio::time::timeout(timeout, handshake::receive(&stream)).await {
        Ok(Ok(Opening::Netns(netns))) => netns.map(Arc::new),
        Ok(Ok(Opening::Plain)) => None,
        Ok(Ok(Opening::Closed)) => return,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "an API connection opened badly; closed");
            return;
        }
        Err(_) => {
            tracing::debug!(?timeout, "an API connection sent nothing in time; closed");
            return;
        }
    };
    let peer = Peer {
        credentials: stream.peer_cred().ok(),
        netns,
    };
    let _ = tx.send(Ok(Connection { stream, peer })).await;
}
