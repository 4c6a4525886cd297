//! A userspace WAN emulator: TCP proxies that delay bytes between sites, like toxiproxy's latency toxic.
//!
//! The test machine's kernel has no `sch_netem` (nor `fq`, nor `clsact`), so `tc` cannot delay packets. Instead
//! each replica advertises a second port on its own loopback address, where one of these proxies listens and
//! forwards to the replica's real port. Every accepted connection is placed by its source address: a replica's
//! address is at that replica's site (replicas bind their outgoing connections to their own address), anything
//! else (the benchmark's clients on 127.0.0.1) at the client site. Across sites, each direction's bytes are
//! written one-way delay (RTT / 2) after they were read, in order, through a bounded queue; within a site they are
//! copied at once. So a request and its answer between sites cost one RTT on top of the work, as on a real link.
//! No bandwidth limit, loss or jitter is modelled.
//!
//! A dead replica must still look dead: its process's port refuses connections, which the controllers' failover
//! watch relies on (`controller/src/leader_watch.rs`). So each proxy holds one idle connection to its replica: when
//! it breaks and the replica's port refuses, the proxy closes its own listener (new connections are refused, and
//! its connections end as the replica's did); it listens again once the replica's port accepts. One difference
//! from a real WAN: there a refused connection is known after one RTT, here at once.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Bytes read per chunk.
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks in flight per direction of one connection (at most 16 MiB): a reader that gets this far ahead waits.
const QUEUE_CHUNKS: usize = 256;
/// Between tries to reach a replica whose port refuses.
const RETRY_MS: u64 = 10;

/// One proxied replica: `listen` (its advertised address) forwards to `upstream` (where it really listens).
#[derive(Debug, Clone)]
pub struct Route {
    pub listen: SocketAddr,
    pub upstream: SocketAddr,
    pub site: String,
}

/// Where each source address is, and the delay between sites.
#[derive(Debug)]
struct Sites {
    by_ip: HashMap<IpAddr, String>,
    client_site: String,
    one_way: Duration,
}

impl Sites {
    fn delay(&self, from: IpAddr, to_site: &str) -> Duration {
        let from_site = self.by_ip.get(&from).unwrap_or(&self.client_site);
        if from_site == to_site { Duration::ZERO } else { self.one_way }
    }
}

/// The running proxies; dropping it stops them all (their connections included).
pub struct Wan {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Wan {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Wan {
    /// Starts one proxy per route. A route's upstream IP is that replica's address, hence its site.
    pub fn start(routes: &[Route], client_site: &str, rtt: Duration) -> Wan {
        let sites = Arc::new(Sites {
            by_ip: routes.iter().map(|r| (r.upstream.ip(), r.site.clone())).collect(),
            client_site: client_site.to_string(),
            one_way: rtt / 2,
        });
        let tasks = routes.iter().map(|r| tokio::spawn(supervise(r.clone(), sites.clone()))).collect();
        Wan { tasks }
    }
}

/// Listens on `route.listen` exactly while the replica accepts connections (see the module's comment).
async fn supervise(route: Route, sites: Arc<Sites>) {
    let mut serving: Option<JoinHandle<()>> = None;
    loop {
        match TcpStream::connect(route.upstream).await {
            Ok(mut sentinel) => {
                if serving.is_none() {
                    match TcpListener::bind(route.listen).await {
                        Ok(listener) => serving = Some(tokio::spawn(serve(listener, route.clone(), sites.clone()))),
                        Err(e) => eprintln!("wan proxy cannot listen on {}: {e}", route.listen),
                    }
                }
                // Returns when the replica closes it: its process died, or it dropped an idle connection.
                let mut byte = [0u8; 1];
                while matches!(sentinel.read(&mut byte).await, Ok(n) if n > 0) {}
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(_) => {
                if let Some(task) = serving.take() {
                    task.abort();
                }
                tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
            }
        }
    }
}

/// Accepts connections until aborted; aborting it ends every connection it accepted.
async fn serve(listener: TcpListener, route: Route, sites: Arc<Sites>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, from)) = accepted else { continue };
                let delay = sites.delay(from.ip(), &route.site);
                connections.spawn(proxy(inbound, route.upstream, delay));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn proxy(inbound: TcpStream, upstream: SocketAddr, delay: Duration) {
    let Ok(outbound) = TcpStream::connect(upstream).await else { return };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    tokio::join!(pipe(in_read, out_write, delay), pipe(out_read, in_write, delay));
}

/// Copies one direction, each chunk written `delay` after it was read; an end of stream is passed on as late.
async fn pipe<R, W>(mut from: R, mut to: W, delay: Duration)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    if delay.is_zero() {
        let _ = tokio::io::copy(&mut from, &mut to).await;
        let _ = to.shutdown().await;
        return;
    }
    // `None`: the end of the stream (or a read error), due at the given time like data.
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(QUEUE_CHUNKS);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            let chunk = (n > 0).then(|| buf[..n].to_vec());
            let end = chunk.is_none();
            // A closed queue means the writer gave up (the other side is gone).
            if tx.send((Instant::now() + delay, chunk)).await.is_err() || end {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            match chunk {
                Some(bytes) => {
                    if to.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                None => {
                    let _ = to.shutdown().await;
                    return;
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server; aborting the returned task closes it and every connection it holds, like a process dying.
    async fn echo(addr: SocketAddr) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let (mut stream, _) = accepted.unwrap();
                        connections.spawn(async move {
                            let (mut r, mut w) = stream.split();
                            let _ = tokio::io::copy(&mut r, &mut w).await;
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        (addr, task)
    }

    fn free_addr() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    async fn connect_eventually(addr: SocketAddr) -> TcpStream {
        let start = std::time::Instant::now();
        loop {
            if let Ok(s) = TcpStream::connect(addr).await {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "the proxy never listened");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// One round trip of `len` bytes through the proxy: the bytes come back intact, in order; returns its time.
    async fn round_trip(stream: &mut TcpStream, len: usize) -> Duration {
        let sent: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let start = std::time::Instant::now();
        let (mut r, mut w) = stream.split();
        let write = async { w.write_all(&sent).await.unwrap() };
        let mut got = vec![0u8; len];
        let read = async { r.read_exact(&mut got).await.unwrap() };
        tokio::join!(write, read);
        assert!(got == sent, "bytes changed or reordered through the proxy");
        start.elapsed()
    }

    #[tokio::test]
    async fn crossing_sites_costs_one_rtt_per_round_trip_and_keeps_bytes_in_order() {
        let rtt = Duration::from_millis(200);
        // The replica at its own address; the test's connection comes from 127.0.0.1, no replica's address, so
        // it is at the client site "a".
        let (upstream, _server) = echo("127.0.0.2:0".parse().unwrap()).await;
        let listen = free_addr();
        let _wan = Wan::start(&[Route { listen, upstream, site: "b".into() }], "a", rtt);
        let mut stream = connect_eventually(listen).await;
        for len in [1, 100_000] {
            let took = round_trip(&mut stream, len).await;
            assert!(took >= rtt, "{len} bytes came back after {took:?}, under the RTT {rtt:?}");
            assert!(took < rtt + Duration::from_millis(300), "{len} bytes came back after {took:?}");
        }
    }

    #[tokio::test]
    async fn within_a_site_nothing_is_delayed() {
        let (upstream, _server) = echo("127.0.0.1:0".parse().unwrap()).await;
        let listen = free_addr();
        let _wan = Wan::start(&[Route { listen, upstream, site: "a".into() }], "a", Duration::from_secs(2));
        let mut stream = connect_eventually(listen).await;
        let took = round_trip(&mut stream, 1000).await;
        assert!(took < Duration::from_millis(500), "a same-site round trip took {took:?}");
    }

    /// The failover watch needs a dead replica's port to refuse connections, proxy or not.
    #[tokio::test]
    async fn the_proxy_refuses_connections_while_its_replica_is_down() {
        let (upstream, server) = echo("127.0.0.2:0".parse().unwrap()).await;
        let listen = free_addr();
        let _wan = Wan::start(&[Route { listen, upstream, site: "b".into() }], "a", Duration::from_millis(20));
        let mut stream = connect_eventually(listen).await;
        round_trip(&mut stream, 10).await;
        server.abort();
        let start = std::time::Instant::now();
        loop {
            match TcpStream::connect(listen).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                Ok(_) | Err(_) => {}
            }
            assert!(start.elapsed() < Duration::from_secs(2), "the proxy still accepts for a dead replica");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The proxied connection ends as the replica's did.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the connection outlived its replica: {read:?}");
        // The replica comes back on its port: the proxy listens again.
        let (_again, _server) = echo(upstream).await;
        let mut stream = connect_eventually(listen).await;
        round_trip(&mut stream, 10).await;
    }
}
