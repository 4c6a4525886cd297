//! Advance reservations: `scontrol create|update|delete reservation`, `scontrol show reservation`, `sinfo -T`.

use drover_state::hostlist::expand_hostlist;
use drover_state::slurm_time::parse_time_limit;
use drover_state::{AdminOp, Reservation, ReservationFlag, ReservationUpdate};

use crate::slurm::reservations::show_text;

/// Every `Key=Value` of the command line, keys lower-cased.
fn pairs<'a>(words: &[&'a str]) -> anyhow::Result<Vec<(String, &'a str)>> {
    words
        .iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => Ok((k.to_ascii_lowercase(), v)),
            None => anyhow::bail!("invalid reservation argument {w:?}: expected Key=Value"),
        })
        .collect()
}

fn list(value: &str) -> Vec<String> {
    value.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()
}

fn flags(value: &str) -> anyhow::Result<Vec<ReservationFlag>> {
    list(value)
        .iter()
        .map(|f| {
            ReservationFlag::parse(f)
                .ok_or_else(|| anyhow::anyhow!("Invalid reservation flag {f:?}: Drover supports MAINT and IGNORE_JOBS"))
        })
        .collect()
}

/// `TRES=gres/gpu=8` (or `gres/gpu:8`).
fn gpu_tres(value: &str) -> anyhow::Result<u32> {
    let lower = value.to_ascii_lowercase();
    let count = lower
        .strip_prefix("gres/gpu=")
        .or_else(|| lower.strip_prefix("gres/gpu:"))
        .ok_or_else(|| anyhow::anyhow!("Invalid TRES {value:?}: Drover reserves GPUs as TRES=gres/gpu=N"))?;
    count.parse().map_err(|_| anyhow::anyhow!("Invalid TRES {value:?}: the GPU count is not a number"))
}

/// A reservation's `StartTime=`/`EndTime=` as Slurm's `scontrol` reads them: Slurm's `parse_time`, looking ahead
/// (`now+30minutes`, `tomorrow`, `16:00`, `YYYY-MM-DDTHH:MM[:SS]`, ...), in ms.
fn parse_start(value: &str, now_ms: u64) -> anyhow::Result<u64> {
    let at_s = crate::slurm::time::parse_time(value, now_ms / 1_000, false).map_err(|e| anyhow::anyhow!(e))?;
    let at_s = u64::try_from(at_s).map_err(|_| anyhow::anyhow!("Invalid time specification {value:?}: before 1970"))?;
    // `now` keeps the clock's milliseconds, as the reservation's times always did.
    Ok(if at_s == now_ms / 1_000 { now_ms } else { at_s * 1_000 })
}

/// Duration in Slurm's forms (minutes, `[D-]HH:MM:SS`, `UNLIMITED`); `None` = open-ended.
fn parse_duration_ms(value: &str) -> anyhow::Result<Option<u64>> {
    let parsed = parse_time_limit(value).map_err(|e| anyhow::anyhow!("Invalid Duration {value:?}: {e}"))?;
    Ok(parsed.map(|s| s * 1_000))
}

/// The reservation's nodes for `Nodes=LIST` or `NodeCnt=N` (the first N schedulable nodes by name, idle ones
/// first, that no other reservation holds).
async fn pick_nodes(client: &drover_client::Client, count: usize) -> anyhow::Result<Vec<String>> {
    let nodes = client.list_nodes(false).await?;
    let registry = client.registry(false).await?;
    let taken: Vec<&String> = registry.reservations.iter().flat_map(|r| &r.nodes).collect();
    let mut free: Vec<&drover_state::Node> =
        nodes.iter().filter(|n| n.schedulable() && !taken.contains(&&n.info.name)).collect();
    free.sort_by_key(|n| (!n.allocated_gpus.is_empty(), n.info.name.clone()));
    if free.len() < count {
        anyhow::bail!(
            "Error creating the reservation: NodeCnt={count} but only {} nodes are free of other reservations",
            free.len()
        );
    }
    Ok(free.into_iter().take(count).map(|n| n.info.name.clone()).collect())
}

pub fn create(controllers: Option<&str>, words: &[&str]) -> anyhow::Result<i32> {
    let now = drover_common::wall::now_ms();
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let mut r = Reservation { start_ms: now, ..Reservation::default() };
    let mut duration = None;
    let mut node_count = None;
    for (key, value) in pairs(words)? {
        match key.as_str() {
            "reservation" | "reservationname" => r.name = value.to_string(),
            "starttime" => r.start_ms = parse_start(value, now)?,
            "endtime" => r.end_ms = Some(parse_start(value, now)?),
            "duration" => duration = Some(parse_duration_ms(value)?),
            "nodes" if value.eq_ignore_ascii_case("ALL") => {
                r.nodes = rt.block_on(client.list_nodes(false))?.into_iter().map(|n| n.info.name).collect()
            }
            "nodes" => r.nodes = expand_hostlist(value).map_err(|e| anyhow::anyhow!("Invalid Nodes={value}: {e}"))?,
            "nodecnt" => {
                node_count = Some(value.parse::<usize>().map_err(|_| anyhow::anyhow!("Invalid NodeCnt {value:?}"))?)
            }
            "tres" => r.gpu_count = Some(gpu_tres(value)?),
            "users" | "user" => r.users = list(value),
            "accounts" | "account" => r.accounts = list(value),
            "flags" => r.flags = flags(value)?,
            "partitionname" | "partition" => r.partition = Some(value.to_string()),
            other => anyhow::bail!(
                "Unsupported reservation option {other:?} (ReservationName, StartTime, EndTime, Duration, Nodes, NodeCnt, TRES=gres/gpu=N, Users, Accounts, Flags, PartitionName)"
            ),
        }
    }
    if r.name.is_empty() {
        anyhow::bail!("Error creating the reservation: ReservationName= is required");
    }
    match (duration, r.end_ms) {
        (Some(_), Some(_)) => anyhow::bail!("Error creating the reservation: give Duration or EndTime, not both"),
        (Some(d), None) => r.end_ms = d.map(|d| r.start_ms + d),
        (None, None) => anyhow::bail!(
            "Error creating the reservation: Duration= or EndTime= is required (Duration=UNLIMITED for open-ended)"
        ),
        (None, Some(_)) => {}
    }
    if let Some(count) = node_count {
        if !r.nodes.is_empty() {
            anyhow::bail!("Error creating the reservation: give Nodes or NodeCnt, not both");
        }
        r.nodes = rt.block_on(pick_nodes(&client, count))?;
    }
    let name = r.name.clone();
    rt.block_on(client.admin(&AdminOp::CreateReservation(r)))
        .map_err(|e| anyhow::anyhow!("Error creating the reservation: {e}"))?;
    println!("Reservation created: {name}");
    Ok(0)
}

pub fn update(controllers: Option<&str>, words: &[&str]) -> anyhow::Result<i32> {
    let now = drover_common::wall::now_ms();
    let client = crate::connect::client(controllers)?;
    let rt = crate::connect::runtime();
    let mut u = ReservationUpdate::default();
    let mut duration = None;
    for (key, value) in pairs(words)? {
        match key.as_str() {
            "reservationname" => u.name = value.to_string(),
            "starttime" => u.start_ms = Some(parse_start(value, now)?),
            "endtime" => u.end_ms = Some(parse_start(value, now)?),
            "duration" => duration = Some(parse_duration_ms(value)?),
            "nodes" => {
                u.nodes = Some(expand_hostlist(value).map_err(|e| anyhow::anyhow!("Invalid Nodes={value}: {e}"))?)
            }
            "tres" => u.gpu_count = Some(gpu_tres(value)?),
            "users" | "user" => u.users = Some(list(value)),
            "accounts" | "account" => u.accounts = Some(list(value)),
            "flags" => u.flags = Some(flags(value)?),
            other => anyhow::bail!(
                "Unsupported reservation update {other:?} (StartTime, EndTime, Duration, Nodes, TRES, Users, Accounts, Flags)"
            ),
        }
    }
    if let Some(d) = duration {
        // Duration counts from the (new or current) start.
        let start = match u.start_ms {
            Some(s) => s,
            None => {
                let registry = rt.block_on(client.registry(false))?;
                let current = registry.reservations.iter().find(|r| r.name == u.name);
                current.map(|r| r.start_ms).ok_or_else(|| anyhow::anyhow!("Reservation {} not found", u.name))?
            }
        };
        match d {
            Some(d) => u.end_ms = Some(start + d),
            None => u.end_open = true,
        }
    }
    rt.block_on(client.admin(&AdminOp::UpdateReservation(u)))
        .map_err(|e| anyhow::anyhow!("Error updating the reservation: {e}"))?;
    println!("Reservation updated.");
    Ok(0)
}

pub fn delete(controllers: Option<&str>, word: &str) -> anyhow::Result<i32> {
    let name = word.split_once('=').map(|(_, v)| v).unwrap_or(word).to_string();
    let client = crate::connect::client(controllers)?;
    crate::connect::runtime()
        .block_on(client.admin(&AdminOp::DeleteReservation(name)))
        .map_err(|e| anyhow::anyhow!("Error deleting the reservation: {e}"))?;
    Ok(0)
}

pub fn show(controllers: Option<&str>, name: Option<&str>) -> anyhow::Result<i32> {
    let client = crate::connect::client(controllers)?;
    let registry = crate::connect::runtime().block_on(client.registry(false))?;
    let shown: Vec<&Reservation> = registry.reservations.iter().filter(|r| name.is_none_or(|n| n == r.name)).collect();
    if shown.is_empty() {
        match name {
            Some(n) => {
                eprintln!("Reservation {n} not found");
                return Ok(1);
            }
            None => println!("No reservations in the system"),
        }
    }
    for r in shown {
        println!("{}", show_text(r, registry.now_ms));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_in_slurms_forms() {
        let now = 1_000_000;
        assert_eq!(parse_start("now", now).unwrap(), now);
        assert_eq!(parse_start("now+30minutes", now).unwrap(), now + 1_800_000);
        assert_eq!(parse_start("NOW+2hours", now).unwrap(), now + 7_200_000);
        assert_eq!(parse_start("now+1days", now).unwrap(), now + 86_400_000);
        assert!(parse_start("2026-12-03T10:00:00", now).unwrap() > 1_700_000_000_000);
        assert_eq!(parse_start("2026-12-03T10:00", now).unwrap(), parse_start("2026-12-03T10:00:00", now).unwrap());
        assert!(parse_start("tomorrow", now).unwrap() > now, "Slurm's scontrol takes every parse_time form");
        assert!(parse_start("sideways", now).unwrap_err().to_string().contains("Invalid time specification"));
        assert!(parse_start("now+3fortnights", now).is_err());
    }

    #[test]
    fn gpu_tres_and_flags() {
        assert_eq!(gpu_tres("gres/gpu=8").unwrap(), 8);
        assert_eq!(gpu_tres("gres/gpu:4").unwrap(), 4);
        assert!(gpu_tres("cpu=4").is_err());
        assert_eq!(flags("MAINT").unwrap(), vec![ReservationFlag::Maint]);
        assert!(flags("DAILY").unwrap_err().to_string().contains("MAINT"));
    }
}
