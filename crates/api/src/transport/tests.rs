//! Both ends of the transport, over real unix sockets and a real tonic server.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::*;
use crate::v1::agent_client::AgentClient;
use crate::v1::agent_server::{Agent, AgentServer};
use crate::v1::{StatusRequest, StatusResponse};

/// Answers Status with what it saw of the caller: the passed namespace's inode (or "none") as
/// the version, and the peer's pid as the uptime.
struct Echo;

#[tonic::async_trait]
impl Agent for Echo {
    async fn status(
        &self,
        request: tonic::Request<StatusRequest>,
    ) -> Result<tonic::Response<StatusResponse>, tonic::Status> {
        let peer = Peer::of(&request).ok_or_else(|| tonic::Status::internal("no peer"))?;
        let version = match &peer.netns {
            Some(fd) => std::fs::File::from(fd.try_clone()?)
                .metadata()?
                .ino()
                .to_string(),
            None => "none".into(),
        };
        Ok(tonic::Response::new(StatusResponse {
            version,
            uptime_ms: peer
                .credentials
                .and_then(|c| c.pid())
                .map_or(0, |p| p as u64),
            ..StatusResponse::default()
        }))
    }
}

fn serve(path: &Path, timeout: Duration) {
    let listener = UnixListener::bind(path).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServer::new(Echo))
            .serve_with_incoming(incoming(listener, timeout)),
    );
}

async fn status(channel: tonic::transport::Channel) -> StatusResponse {
    AgentClient::new(channel)
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

fn some_fd(dir: &Path) -> (OwnedFd, u64) {
    let path = dir.join("handle");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(b"x")
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let ino = file.metadata().unwrap().ino();
    (file.into(), ino)
}

#[tokio::test]
async fn the_descriptor_reaches_the_handler_and_plain_clients_pass_none() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    serve(&socket, HANDSHAKE_TIMEOUT);
    let (fd, ino) = some_fd(dir.path());
    let with = status(connect_with_netns(&socket, fd).await.unwrap()).await;
    assert_eq!(with.version, ino.to_string());
    assert_eq!(with.uptime_ms, u64::from(std::process::id()));
    let without = status(connect(&socket).await.unwrap()).await;
    assert_eq!(without.version, "none");
}

#[tokio::test]
async fn a_silent_client_holds_up_nobody_and_is_closed_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let timeout = Duration::from_millis(500);
    serve(&socket, timeout);
    let mut silent = UnixStream::connect(&socket).await.unwrap();
    let began = Instant::now();
    let answer = status(connect(&socket).await.unwrap()).await;
    assert_eq!(answer.version, "none");
    assert!(began.elapsed() < timeout, "{:?}", began.elapsed());
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0))), "{read:?}");
    assert!(began.elapsed() >= timeout);
}

#[tokio::test]
async fn a_magic_sent_in_pieces_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    serve(&socket, HANDSHAKE_TIMEOUT);
    let mut stream = UnixStream::connect(&socket).await.unwrap();
    stream.write_all(&handshake::MAGIC[..4]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    stream.write_all(&handshake::MAGIC[4..]).await.unwrap();
    // HTTP/2 on the same stream: had the server taken the pieces for HTTP/2, it would fail.
    let stream = std::sync::Mutex::new(Some(stream));
    let channel = tonic::transport::Endpoint::from_static("http://cellium.agent")
        .connect_with_connector(tower::service_fn(move |_| {
            let taken = stream.lock().unwrap().take();
            async move {
                taken
                    .map(hyper_util::rt::TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("used once"))
            }
        }))
        .await
        .unwrap();
    assert_eq!(status(channel).await.version, "none");
}

#[tokio::test]
async fn a_refusal_reaches_the_client_with_its_reason() {
    struct Refuse;
    #[tonic::async_trait]
    impl Agent for Refuse {
        async fn status(
            &self,
            _: tonic::Request<StatusRequest>,
        ) -> Result<tonic::Response<StatusResponse>, tonic::Status> {
            Err(crate::refusal(crate::Reason::NetnsRefused, "no"))
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServer::new(Refuse))
            .serve_with_incoming(incoming(listener, HANDSHAKE_TIMEOUT)),
    );
    let err = AgentClient::new(connect(&socket).await.unwrap())
        .status(StatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(crate::reason_of(&err), Some(crate::Reason::NetnsRefused));
}

#[tokio::test]
async fn two_descriptors_close_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    serve(&socket, HANDSHAKE_TIMEOUT);
    let mut stream = UnixStream::connect(&socket).await.unwrap();
    let (a, _) = some_fd(dir.path());
    let (b, _) = some_fd(dir.path());
    let fds = [a.as_fd(), b.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
    rustix::net::sendmsg(
        &stream,
        &[std::io::IoSlice::new(handshake::MAGIC)],
        &mut control,
        rustix::net::SendFlags::NOSIGNAL,
    )
    .unwrap();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0))), "{read:?}");
}
