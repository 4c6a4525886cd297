//! The server side of the replica-to-replica transport.

use std::sync::atomic::{AtomicU64, Ordering};

use drover_proto::v1::raft_service_server::RaftService;
use drover_proto::v1::{RaftReply, RaftRequest, SnapshotChunk};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tonic::{Request, Response, Status, Streaming};

use crate::network::SnapshotHeader;
use crate::store::SnapshotFile;
use crate::types::Raft;

/// The largest snapshot a replica accepts; beyond this the sender is misbehaving.
const MAX_SNAPSHOT_BYTES: u64 = 64 << 30;

pub struct RaftServer {
    pub raft: Raft,
    pub snapshot_dir: std::path::PathBuf,
    pub received: AtomicU64,
    /// Marks every accepted append (heartbeats included), for `leader_watch`.
    pub heard: crate::leader_watch::LastHeard,
}

fn reply<T: Serialize, E: Serialize>(result: Result<T, E>) -> Result<Response<RaftReply>, Status> {
    let reply = match result {
        Ok(v) => {
            RaftReply { data: drover_state::codec::encode(&v).expect("openraft messages serialize"), error: vec![] }
        }
        // Errors stay JSON: the calling replica logs them as text.
        Err(e) => RaftReply { data: vec![], error: serde_json::to_vec(&e).expect("openraft errors serialize") },
    };
    Ok(Response::new(reply))
}

fn decode<T: for<'de> serde::Deserialize<'de>>(request: Request<RaftRequest>) -> Result<T, Status> {
    drover_state::codec::decode(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("malformed raft message: {e}")))
}

#[tonic::async_trait]
impl RaftService for RaftServer {
    async fn append_entries(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let result = self.raft.append_entries(decode(request)?).await;
        // Anything but a refusal means a leader this replica accepts is alive (a conflict is still a heartbeat).
        if matches!(&result, Ok(r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_))) {
            self.heard.now();
        }
        reply(result)
    }

    type StreamAppendStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftReply, Status>> + Send>>;

    async fn stream_append(
        &self,
        request: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<Self::StreamAppendStream>, Status> {
        use futures::StreamExt;
        // A malformed request ends the input: openraft answers what came before it, then the stream closes.
        let input = tokio_stream::StreamExt::map_while(request.into_inner(), |item| {
            let request = item.ok()?;
            drover_state::codec::decode::<openraft::raft::AppendEntriesRequest<crate::types::TypeConfig>>(&request.data)
                .ok()
        });
        let heard = self.heard.clone();
        let output = self.raft.stream_append(input).map(move |result| {
            let data = match result {
                Ok(appended) => {
                    // As for a single append: anything but a refusal means a leader this replica accepts is alive.
                    if !matches!(appended, Err(openraft::raft::StreamAppendError::HigherVote(_))) {
                        heard.now();
                    }
                    appended
                }
                Err(fatal) => return Ok(RaftReply { data: vec![], error: fatal.to_string().into_bytes() }),
            };
            Ok(RaftReply {
                data: drover_state::codec::encode(&data).expect("openraft messages serialize"),
                error: vec![],
            })
        });
        Ok(Response::new(Box::pin(output)))
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        reply(self.raft.vote(decode(request)?).await)
    }

    async fn pre_vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        reply(self.raft.pre_vote(decode(request)?).await)
    }

    async fn transfer_leader(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        reply(self.raft.handle_transfer_leader(decode(request)?).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        let mut stream = request.into_inner();
        let n = self.received.fetch_add(1, Ordering::Relaxed);
        let path = self.snapshot_dir.join(format!("recv-{}-{n}.part", std::process::id()));
        let result = self.receive(&mut stream, &path).await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&path).await;
        }
        let header = result?;
        let snapshot = openraft::alias::SnapshotOf::<crate::types::TypeConfig, SnapshotFile> {
            meta: header.meta,
            snapshot: SnapshotFile { path },
        };
        reply(self.raft.install_full_snapshot(header.vote, snapshot).await)
    }
}

impl RaftServer {
    /// Writes the streamed chunks to `path` (fsynced) and returns the header of the first chunk.
    async fn receive(
        &self,
        stream: &mut Streaming<SnapshotChunk>,
        path: &std::path::Path,
    ) -> Result<SnapshotHeader, Status> {
        let io = |e: std::io::Error| Status::internal(format!("writing snapshot {}: {e}", path.display()));
        let mut file = tokio::fs::File::create(path).await.map_err(io)?;
        let mut header = None;
        let mut total = 0u64;
        while let Some(chunk) = stream.message().await? {
            if header.is_none() {
                let parsed: SnapshotHeader = drover_state::codec::decode(&chunk.header)
                    .map_err(|e| Status::invalid_argument(format!("malformed snapshot header: {e}")))?;
                header = Some(parsed);
            }
            total += chunk.data.len() as u64;
            if total > MAX_SNAPSHOT_BYTES {
                return Err(Status::resource_exhausted("snapshot larger than 64 GiB"));
            }
            file.write_all(&chunk.data).await.map_err(io)?;
        }
        file.sync_all().await.map_err(io)?;
        header.ok_or_else(|| Status::invalid_argument("empty snapshot stream"))
    }
}
