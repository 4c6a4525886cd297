//! What a controller shows operators over plain HTTP (off unless `http_listen` is set): `/metrics` for
//! Prometheus, and a read-only web page (`/`) with the JSON it is drawn from (`/api/overview`, `/api/job?id=N`).
//!
//! Every replica serves its own view, read from its applied state without a round trip to the leader: a
//! dashboard must keep working when the leader is gone, which is when it is needed most. The page says which
//! replica answered and up to which log index it had applied.

mod metrics;
mod views;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use drover_observe::http::{Handler, Request, Response, ResponseFuture};
use openraft::async_runtime::WatchReceiver;

use crate::api::Api;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// The HTTP side of one replica.
pub struct Web {
    api: Arc<Api>,
    /// Leaders this replica has seen take over since it started (`drover_raft_leader_changes_total`).
    leader_changes: Arc<AtomicU64>,
}

impl Web {
    /// Also starts counting leader changes, for as long as Raft runs.
    pub fn new(api: Arc<Api>) -> Arc<Web> {
        let leader_changes = Arc::new(AtomicU64::new(0));
        tokio::spawn(count_leader_changes(api.raft.clone(), leader_changes.clone()));
        Arc::new(Web { api, leader_changes })
    }
}

impl Handler for Web {
    fn handle(&self, request: Request) -> ResponseFuture {
        let api = self.api.clone();
        let leader_changes = self.leader_changes.load(Ordering::Relaxed);
        Box::pin(async move {
            match request.path.as_str() {
                "/" | "/index.html" => Response::ok("text/html; charset=utf-8", INDEX_HTML),
                "/app.js" => Response::ok("text/javascript; charset=utf-8", APP_JS),
                "/style.css" => Response::ok("text/css; charset=utf-8", STYLE_CSS),
                "/metrics" => metrics::exposition(&api, leader_changes).into_response(),
                "/api/overview" => views::overview(&api).await,
                "/api/job" => match request.param("id").map(str::parse::<u64>) {
                    Some(Ok(id)) => views::job(&api, id),
                    _ => Response::error(400, "give the job as /api/job?id=NUMBER"),
                },
                "/healthz" => health(&api),
                _ => Response::error(404, format!("nothing at {}; try /, /metrics or /api/overview", request.path)),
            }
        })
    }
}

/// 200 while Raft runs on this replica and it knows a leader; 503 otherwise (for load balancers and compose).
fn health(api: &Api) -> Response {
    let metrics = api.raft.metrics().borrow_watched().clone();
    match (&metrics.running_state, metrics.current_leader) {
        (Err(e), _) => Response::error(503, format!("raft stopped: {e}")),
        (Ok(()), None) => Response::error(503, "no leader known yet"),
        (Ok(()), Some(leader)) => {
            Response::ok("text/plain; charset=utf-8", format!("ok: leader is replica {leader}\n"))
        }
    }
}

/// A change is a new (term's leader id, leader) pair with a leader: the same replica re-elected in a later term
/// counts too.
async fn count_leader_changes(raft: crate::types::Raft, changes: Arc<AtomicU64>) {
    let mut metrics = raft.server_metrics();
    let mut last = None;
    loop {
        // The term's leader id, not the whole vote: a leader's vote becomes committed after it is elected, and
        // a watcher that sees both states would count one leader twice.
        let (vote, leader) = {
            let m = metrics.borrow_watched();
            (*m.vote.leader_id(), m.current_leader)
        };
        if let Some(leader) = leader
            && last.as_ref() != Some(&(vote, leader))
        {
            changes.fetch_add(1, Ordering::Relaxed);
            last = Some((vote, leader));
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
