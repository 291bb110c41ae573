//! Dialling Core's local endpoint: a Unix socket, or a named pipe on
//! Windows whose server is checked to run as this user first.

/// A tonic channel to Core's local endpoint (or any gRPC server on one, for
/// tests): a Unix socket path, or on Windows a named pipe name such as
/// `\\.\pipe\pedelec-ada-core` (`pedelec_protocol::discovery::endpoint_for`).
///
/// # Examples
///
/// ```no_run
/// use pedelec_protocol::discovery::{default_socket, default_state_dir};
/// use pedelec_ipc::local_channel;
/// use pedelec_protocol::pb::{PingRequest, core_client::CoreClient};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let env = |k: &str| std::env::var(k).ok();
/// let channel = local_channel(&default_socket(env, &default_state_dir(env))).await?;
/// let pong = CoreClient::new(channel).ping(PingRequest {}).await?.into_inner();
/// assert!(pong.pid > 0);
/// # Ok(())
/// # }
/// ```
pub async fn local_channel(endpoint: &std::path::Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = endpoint.to_path_buf();
    tonic::transport::Endpoint::from_static("http://pedelec-core.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(connect_local(&path).await?)) }
        }))
        .await
}

/// One connection to a local endpoint: a Unix socket.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> std::io::Result<()> {
/// let stream = pedelec_ipc::connect_local("/run/user/1000/pedelec/core.sock".as_ref()).await?;
/// # drop(stream);
/// # Ok(())
/// # }
/// ```
#[cfg(unix)]
pub async fn connect_local(endpoint: &std::path::Path) -> std::io::Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::connect(endpoint).await
}

/// One connection to a local endpoint: a named pipe client. A pipe whose
/// every instance is taken answers `ERROR_PIPE_BUSY` until the server
/// offers the next one (it does so as each connection is accepted), so
/// that is retried for up to 2 s; any other error is returned at once.
///
/// A pipe served by a process of another user is refused
/// (`PermissionDenied`) before anything is sent on it: see
/// [`crate::pipe_owner`].
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> std::io::Result<()> {
/// let pipe = pedelec_ipc::connect_local(r"\\.\pipe\pedelec-ada-core".as_ref()).await?;
/// # drop(pipe);
/// # Ok(())
/// # }
/// ```
#[cfg(windows)]
pub async fn connect_local(
    endpoint: &std::path::Path,
) -> std::io::Result<tokio::net::windows::named_pipe::NamedPipeClient> {
    const ERROR_PIPE_BUSY: i32 = 231;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match tokio::net::windows::named_pipe::ClientOptions::new().open(endpoint) {
            Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Ok(pipe) => {
                use std::os::windows::io::AsRawHandle;
                crate::pipe_owner::check_server_is_current_user(pipe.as_raw_handle())?;
                return Ok(pipe);
            }
            Err(e) => return Err(e),
        }
    }
}
