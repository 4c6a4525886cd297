//! The agent's `/metrics`: per GPU its load, memory, temperature, ECC errors, health and the job holding it (from
//! NVML, or the simulated backend); and the node's session, lease and heartbeats. GPU figures come from the
//! latest health poll (one per heartbeat), so a scrape never waits on NVML.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use drover_observe::http::{Handler, Request, Response, ResponseFuture};
use drover_observe::metrics::{Exposition, labels};

use crate::node::{NodeAgent, Observed};

pub struct AgentMetrics(pub Arc<NodeAgent>);

impl Handler for AgentMetrics {
    fn handle(&self, request: Request) -> ResponseFuture {
        let agent = self.0.clone();
        Box::pin(async move {
            match request.path.as_str() {
                "/metrics" => {
                    let store = {
                        let agent = agent.clone();
                        tokio::task::spawn_blocking(move || agent.image_store_status()).await.ok().flatten()
                    };
                    let mut out =
                        exposition(&agent.info.name, &agent.observed(), agent.heartbeats_sent.load(Ordering::Relaxed));
                    if let Some(store) = store {
                        image_store(&mut out, &store);
                    }
                    out.into_response()
                }
                _ => Response::error(404, format!("nothing at {}; try /metrics", request.path)),
            }
        })
    }
}

pub fn exposition(node: &str, seen: &Observed, heartbeats_sent: u64) -> Exposition {
    let mut out = Exposition::default();
    let flag = |b: bool| f64::from(u8::from(b));
    out.gauge("agent_connected", "1 while the agent has a session with the leader.", flag(seen.connected));
    out.gauge("agent_fenced", "1 while the node's tasks are killed for want of a lease.", flag(seen.fenced));
    out.gauge("agent_lease_remaining_seconds", "Time left on the node's lease from the leader.", {
        seen.lease_left_ms as f64 / 1_000.0
    });
    out.gauge("agent_jobs", "Jobs assigned to this node and not being stopped.", seen.jobs as f64);
    out.counter("agent_heartbeats_sent", "Heartbeats sent to the leader since the agent started.", heartbeats_sent);
    let gpu = |index: u32| labels([("node", node), ("gpu", &index.to_string())]);
    let per_gpu = |value: &dyn Fn(&crate::gpu::GpuHealth) -> Option<f64>| -> Vec<_> {
        seen.health.iter().filter_map(|h| value(h).map(|v| (gpu(h.index), v))).collect()
    };
    out.labelled(
        "gpu_utilization_ratio",
        "Fraction of the last sample period a kernel ran on the GPU (NVML).",
        per_gpu(&|h| h.utilization_pct.map(|p| f64::from(p) / 100.0)),
    );
    out.labelled(
        "gpu_memory_used_bytes",
        "GPU memory in use (NVML).",
        per_gpu(&|h| h.memory_used_mb.map(|mb| (mb << 20) as f64)),
    );
    out.labelled("gpu_temperature_celsius", "GPU temperature (NVML).", per_gpu(&|h| h.temperature_c.map(f64::from)));
    out.labelled(
        "gpu_ecc_uncorrected_errors",
        "Uncorrected ECC errors since the driver loaded (volatile counter).",
        per_gpu(&|h| Some(h.ecc_uncorrected as f64)),
    );
    out.labelled(
        "gpu_healthy",
        "1 when the GPU passes the health check, 0 when it is withheld from jobs.",
        per_gpu(&|h| Some(flag(h.problem.is_none()))),
    );
    out.labelled(
        "gpu_allocated",
        "1 when a job holds the GPU.",
        per_gpu(&|h| Some(flag(seen.gpu_jobs.contains_key(&h.index)))),
    );
    out
}

/// The node's container image store: how full it is, and each image's size by digest.
pub fn image_store(out: &mut Exposition, store: &crate::image::StoreStatus) {
    out.gauge("image_store_bytes", "Bytes of unpacked container images cached on this node.", store.total_bytes as f64);
    out.gauge("image_store_limit_bytes", "Size the image store is evicted down to.", store.limit_bytes as f64);
    out.gauge("image_store_images", "Container images cached on this node.", store.images.len() as f64);
    out.labelled(
        "image_bytes",
        "Bytes of one cached image (unpacked), by digest.",
        store.images.iter().map(|i| (labels([("digest", i.digest.as_str())]), i.bytes as f64)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuHealth;

    #[test]
    fn each_gpu_shows_its_load_memory_health_and_whether_a_job_holds_it() {
        let seen = Observed {
            connected: true,
            fenced: false,
            lease_left_ms: 4_500,
            jobs: 1,
            gpu_jobs: [(1, 42)].into_iter().collect(),
            health: vec![
                GpuHealth {
                    index: 0,
                    temperature_c: Some(34),
                    utilization_pct: Some(0),
                    memory_used_mb: Some(0),
                    ..Default::default()
                },
                GpuHealth {
                    index: 1,
                    temperature_c: Some(71),
                    utilization_pct: Some(87),
                    memory_used_mb: Some(81_920),
                    problem: Some("2 uncorrectable ECC errors".into()),
                    ecc_uncorrected: 2,
                    ..Default::default()
                },
            ],
        };
        let text = exposition("gpu01", &seen, 12).text();
        for line in [
            "drover_agent_connected 1.0",
            "drover_agent_lease_remaining_seconds 4.5",
            "drover_agent_heartbeats_sent_total 12",
            "drover_gpu_utilization_ratio{node=\"gpu01\",gpu=\"1\"} 0.87",
            "drover_gpu_memory_used_bytes{node=\"gpu01\",gpu=\"1\"} 85899345920.0",
            "drover_gpu_temperature_celsius{node=\"gpu01\",gpu=\"0\"} 34.0",
            "drover_gpu_healthy{node=\"gpu01\",gpu=\"1\"} 0.0",
            "drover_gpu_healthy{node=\"gpu01\",gpu=\"0\"} 1.0",
            "drover_gpu_allocated{node=\"gpu01\",gpu=\"1\"} 1.0",
            "drover_gpu_allocated{node=\"gpu01\",gpu=\"0\"} 0.0",
            "drover_gpu_ecc_uncorrected_errors{node=\"gpu01\",gpu=\"1\"} 2.0",
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn the_image_store_shows_how_full_it_is_and_each_image_by_digest() {
        let store = crate::image::StoreStatus {
            images: vec![crate::image::StoredImage {
                digest: "sha256:ab".into(),
                reference: "nvcr.io#nvidia/pytorch:24.05-py3".into(),
                bytes: 2048,
                last_used_ms: 1,
            }],
            total_bytes: 2048,
            limit_bytes: 1 << 30,
        };
        let mut out = Exposition::default();
        image_store(&mut out, &store);
        let text = out.text();
        for line in [
            "drover_image_store_bytes 2048.0",
            "drover_image_store_images 1.0",
            "drover_image_store_limit_bytes 1073741824.0",
            "drover_image_bytes{digest=\"sha256:ab\"} 2048.0",
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line:?} in:\n{text}");
        }
    }
}
