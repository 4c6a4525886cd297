//! A submission load for the replicated-controller stories: client loops that submit until stopped and record
//! every acknowledged id with when it was acknowledged, so a story can check none is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_cli::local::trivial_spec;
use drover_client::Client;

pub struct Load {
    stop: Arc<AtomicBool>,
    pub acked: Arc<Mutex<Vec<(u64, Instant)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(client: Arc<Client>, clients: usize) -> Load {
        Load::start_with(client, clients, trivial_spec())
    }

    /// Like [`Load::start`], submitting `spec` (e.g. held jobs, a load that never reaches the agents).
    pub fn start_with(client: Arc<Client>, clients: usize, spec: drover_state::JobSpec) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..clients)
            .map(|_| {
                let (client, stop, acked, spec) = (client.clone(), stop.clone(), acked.clone(), spec.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        match client.submit(&spec).await {
                            Ok(id) => acked.lock().unwrap().push((id, Instant::now())),
                            // The client has retried until its deadline: no quorum for now. Pause, then go on.
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                })
            })
            .collect();
        Load { stop, acked, tasks }
    }

    pub fn count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Waits (up to a minute) until at least `at_least` submissions were acknowledged.
    pub async fn wait_for(&self, at_least: usize) {
        let started = Instant::now();
        while self.count() < at_least && started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(self.count() >= at_least, "the load acknowledged only {} submissions", self.count());
    }

    pub async fn stop(self) -> Vec<(u64, Instant)> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.acked.lock().unwrap().clone()
    }
}
