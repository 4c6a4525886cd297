//! `drover rendezvous`: a small env:// rendezvous, the way torch.distributed bootstraps: rank 0 listens on
//! `MASTER_ADDR:MASTER_PORT`, every other rank connects and says who it is, and rank 0 answers once all
//! `WORLD_SIZE` ranks have checked in. The demo and the tests run it under `srun` to prove the environment works.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long ranks wait for each other.
const RENDEZVOUS_TIMEOUT_S: u64 = 60;

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).map_err(|_| anyhow::anyhow!("{name} is not set (run under srun inside a job)"))
}

pub fn run() -> anyhow::Result<()> {
    let rank: u32 = var("RANK")?.parse()?;
    let world: u32 = var("WORLD_SIZE")?.parse()?;
    let addr = format!("{}:{}", var("MASTER_ADDR")?, var("MASTER_PORT")?);
    let deadline = Instant::now() + Duration::from_secs(RENDEZVOUS_TIMEOUT_S);
    if rank == 0 {
        let listener = TcpListener::bind(format!("0.0.0.0:{}", var("MASTER_PORT")?)).map_err(|e| {
            anyhow::anyhow!("rank 0 cannot listen on port {}: {e}", var("MASTER_PORT").unwrap_or_default())
        })?;
        listener.set_nonblocking(true)?;
        let mut seen = BTreeSet::from([0u32]);
        let mut peers = Vec::new();
        while seen.len() < world as usize {
            if Instant::now() > deadline {
                anyhow::bail!("rank 0: only ranks {seen:?} of {world} arrived within {RENDEZVOUS_TIMEOUT_S} s");
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false)?;
                    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                    let mut line = String::new();
                    BufReader::new(stream.try_clone()?).read_line(&mut line)?;
                    let peer: u32 = line.trim().parse().map_err(|_| anyhow::anyhow!("bad hello {line:?}"))?;
                    if peer >= world || !seen.insert(peer) {
                        anyhow::bail!("rank 0: rank {peer} is out of range or arrived twice");
                    }
                    peers.push(stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(e.into()),
            }
        }
        for mut peer in peers {
            writeln!(peer, "ok {world}")?;
        }
        println!("rank 0/{world}: all {world} ranks met at {addr}");
        return Ok(());
    }
    let mut stream = loop {
        match TcpStream::connect(&addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => anyhow::bail!("rank {rank}: cannot reach rank 0 at {addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    writeln!(stream, "{rank}")?;
    stream.set_read_timeout(Some(Duration::from_secs(RENDEZVOUS_TIMEOUT_S)))?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    if reply.trim() != format!("ok {world}") {
        anyhow::bail!("rank {rank}: unexpected answer {reply:?} from rank 0");
    }
    println!("rank {rank}/{world}: met rank 0 at {addr}");
    Ok(())
}
