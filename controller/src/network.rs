//! Replica-to-replica transport: openraft's messages over gRPC. Payloads are openraft's own serde types in the
//! binary `drover_state::codec`; snapshots stream out of their checkpoints in bounded chunks.

use std::future::Future;
use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use drover_auth::tls::RoleKind;
use drover_proto::v1::raft_service_client::RaftServiceClient;
use drover_proto::v1::{RaftReply, RaftRequest, SnapshotChunk};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, TransferLeaderResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::store::SnapshotFile;
use crate::types::{ReplicaNode, SnapshotMeta, TypeConfig, Vote};

/// Snapshot chunks: large enough to stream fast, small enough to bound memory on both sides.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// How long a connection attempt to a peer may take before the peer counts as unreachable.
const CONNECT_TIMEOUT_MS: u64 = 300;
/// The longest any snapshot transfer may take as a whole.
const SNAPSHOT_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// The first chunk of a snapshot stream.
#[derive(Serialize, Deserialize)]
pub struct SnapshotHeader {
    pub vote: Vote,
    pub meta: SnapshotMeta,
}

/// Makes one client per peer. `local_ip` binds outgoing connections to this replica's own address, so that a
/// host or a test can cut a replica off by address. Every connection is mutual TLS and the peer's certificate
/// must be a controller's.
#[derive(Clone)]
pub struct Network {
    pub local_ip: Option<IpAddr>,
    pub security: std::sync::Arc<crate::security::Security>,
}

pub struct PeerClient {
    target: u64,
    addr: String,
    client: Option<RaftServiceClient<Channel>>,
    local_ip: Option<IpAddr>,
    security: std::sync::Arc<crate::security::Security>,
}

/// Cuts the snapshot stream into chunks of at most `SNAPSHOT_CHUNK_BYTES` (gRPC messages are limited), the
/// header in the first, and hands them to the sending task. Runs on a blocking thread.
struct ChunkSink {
    tx: tokio::sync::mpsc::Sender<SnapshotChunk>,
    header: Option<Vec<u8>>,
    buf: Vec<u8>,
}

impl Write for ChunkSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(SNAPSHOT_CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == SNAPSHOT_CHUNK_BYTES {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() && self.header.is_none() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(SNAPSHOT_CHUNK_BYTES));
        let chunk = SnapshotChunk { header: self.header.take().unwrap_or_default(), data };
        self.tx
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the snapshot transfer ended"))
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &ReplicaNode) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.clone(),
            client: None,
            local_ip: self.local_ip,
            security: self.security.clone(),
        }
    }
}

fn encode<T: Serialize>(value: &T) -> RaftRequest {
    RaftRequest { data: drover_state::codec::encode(value).expect("openraft messages serialize") }
}

/// A peer's reply: its refusal as an error naming the peer, or the decoded message.
fn decode_reply<T: for<'de> Deserialize<'de>>(target: u64, reply: RaftReply) -> Result<T, RPCError<TypeConfig>> {
    if !reply.error.is_empty() {
        let message = String::from_utf8_lossy(&reply.error).into_owned();
        return Err(RPCError::Network(NetworkError::from_string(format!("replica {target}: {message}"))));
    }
    drover_state::codec::decode(&reply.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))
}

impl PeerClient {
    fn client(&mut self) -> Result<RaftServiceClient<Channel>, RPCError<TypeConfig>> {
        if self.client.is_none() {
            // Lazy: the first request connects, and a broken connection reconnects by itself.
            let channel = self
                .security
                .client_tls
                .channel(
                    &self.addr,
                    self.local_ip,
                    Duration::from_millis(CONNECT_TIMEOUT_MS),
                    Some(RoleKind::Controller),
                )
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
            self.client = Some(RaftServiceClient::new(channel).max_decoding_message_size(256 << 20));
        }
        Ok(self.client.clone().expect("set above"))
    }

    fn decode<T: for<'de> Deserialize<'de>>(&self, reply: RaftReply) -> Result<T, RPCError<TypeConfig>> {
        decode_reply(self.target, reply)
    }

    fn status_error(&mut self, status: tonic::Status) -> RPCError<TypeConfig> {
        let message = format!("replica {} at {}: {}", self.target, self.addr, status.message());
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                RPCError::Unreachable(Unreachable::from_string(message))
            }
            _ => RPCError::Network(NetworkError::from_string(message)),
        }
    }

    async fn send_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut client = self.client().map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))?;
        let header = drover_state::codec::encode(&SnapshotHeader { vote, meta: snapshot.meta.clone() })
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        // A bounded channel: the reader (a blocking thread walking the checkpoint) stays at most a few chunks
        // ahead of the network, and stops when the transfer ends and the receiver is dropped.
        let (tx, rx) = tokio::sync::mpsc::channel::<SnapshotChunk>(4);
        let data = snapshot.snapshot.clone();
        let reader = tokio::task::spawn_blocking(move || {
            let mut sink = ChunkSink { tx, header: Some(header), buf: Vec::with_capacity(SNAPSHOT_CHUNK_BYTES) };
            let result = data.write_to(&mut sink).and_then(|_| sink.flush());
            if let Err(e) = &result {
                tracing::warn!(snapshot = %data.path.display(), "reading snapshot for transfer: {e}");
            }
        });
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        request.set_timeout(Duration::from_millis(SNAPSHOT_TIMEOUT_MS));
        let reply = client.install_snapshot(request).await;
        drop(reader);
        let reply = reply.map_err(|s| match self.status_error(s) {
            RPCError::Unreachable(u) => StreamingError::Unreachable(u),
            other => StreamingError::Network(NetworkError::new(&other)),
        })?;
        self.decode(reply.into_inner()).map_err(|e| StreamingError::Network(NetworkError::new(&e)))
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotFile;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut request = tonic::Request::new(encode(&rpc));
        request.set_timeout(option.hard_ttl());
        let reply = self.client()?.append_entries(request).await.map_err(|s| self.status_error(s))?;
        self.decode(reply.into_inner())
    }

    /// Pipelined: requests after the first go out as openraft produces them, on one gRPC stream whose order
    /// HTTP/2 keeps, and the follower answers each once its entries are on disk. openraft's default sends one
    /// request and waits for its answer before the next, so each commit waited for the previous round trip and
    /// follower fsync. The first request goes alone as a unary call: a heartbeat is a stream of one request, and
    /// opening a gRPC stream per heartbeat overran the heartbeat's 50 ms budget on a loaded machine.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> futures::future::BoxFuture<
        's,
        Result<
            futures::stream::BoxStream<
                's,
                Result<openraft::raft::StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>,
            >,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + openraft::OptionalSend + Unpin + 'static,
    {
        use futures::StreamExt;
        Box::pin(async move {
            let mut input = input;
            let Some(first) = input.next().await else {
                return Ok(futures::stream::empty().boxed());
            };
            let last = first.entries.last().map(openraft::entry::RaftEntry::log_id).or(first.prev_log_id);
            let prev = first.prev_log_id;
            let response = RaftNetworkV2::append_entries(self, first, option).await?;
            // A partial success ends the stream, as in openraft's own sequential stream.
            let partial = matches!(&response, AppendEntriesResponse::PartialSuccess(id) if *id != last);
            let first_result = response.into_stream_result(prev, last);
            let stop = first_result.is_err() || partial;
            let head = futures::stream::once(async move { Ok(first_result) });
            if stop {
                return Ok(head.boxed());
            }
            let mut client = self.client()?;
            let (target, addr) = (self.target, self.addr.clone());
            // Opened only when a second request comes: a heartbeat's stream ends here without one. No deadline
            // on the stream: it lives as long as replication does; a dead peer is found by the connection's
            // keepalive and ends it with an error, after which openraft opens a new one.
            let tail = futures::stream::once(async move {
                let Some(second) = input.next().await else {
                    return futures::stream::empty().boxed();
                };
                let requests = futures::stream::once(async move { second }).chain(input).map(|rpc| encode(&rpc));
                let unreachable = move |status: tonic::Status| {
                    let message = format!("replica {target} at {addr}: {}", status.message());
                    RPCError::Unreachable(Unreachable::from_string(message))
                };
                let replies = match client.stream_append(tonic::Request::new(requests)).await {
                    Ok(replies) => replies.into_inner(),
                    Err(status) => return futures::stream::once(async move { Err(unreachable(status)) }).boxed(),
                };
                replies.map(move |reply| decode_reply(target, reply.map_err(&unreachable)?)).boxed()
            })
            .flatten();
            Ok(head.chain(tail).boxed())
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut request = tonic::Request::new(encode(&rpc));
        request.set_timeout(option.hard_ttl());
        let reply = self.client()?.vote(request).await.map_err(|s| self.status_error(s))?;
        self.decode(reply.into_inner())
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut request = tonic::Request::new(encode(&rpc));
        request.set_timeout(option.hard_ttl());
        let reply = self.client()?.pre_vote(request).await.map_err(|s| self.status_error(s))?;
        self.decode(reply.into_inner())
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut request = tonic::Request::new(encode(&rpc));
        request.set_timeout(option.hard_ttl());
        let reply = self.client()?.transfer_leader(request).await.map_err(|s| self.status_error(s))?;
        self.decode(reply.into_inner())
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, SnapshotFile>,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = self.send_snapshot(vote, snapshot) => result,
        }
    }
}
