//! Advance reservations: `scontrol create|update|delete reservation`, `scontrol show reservation`, `sinfo -T`.

use drover_proto::wire::Registry;
use drover_state::hostlist::{compress_hostlist, expand_hostlist};
use drover_state::slurm_time::{format_duration, parse_time_limit};
use drover_state::{AdminOp, Reservation, ReservationFlag, ReservationUpdate};

use crate::format::format_timestamp;

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

/// Slurm's time forms: `now`, `now+30minutes` (also `+2hours`, `+1days`, plain seconds), `YYYY-MM-DDTHH:MM[:SS]`
/// and `YYYY-MM-DD`, in local time.
pub fn parse_start(value: &str, now_ms: u64) -> anyhow::Result<u64> {
    let bad = || {
        anyhow::anyhow!(
            "Invalid time specification {value:?}: use now, now+N[minutes|hours|days] or YYYY-MM-DDTHH:MM[:SS]"
        )
    };
    let lower = value.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now_ms);
        }
        let rest = rest.strip_prefix('+').ok_or_else(bad)?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let unit_s = match &rest[digits.len()..] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3_600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 7 * 86_400,
            _ => return Err(bad()),
        };
        return Ok(now_ms + n.saturating_mul(unit_s) * 1_000);
    }
    let (date, time) = value.split_once('T').unwrap_or((value, "00:00:00"));
    let d: Vec<i32> = date.split('-').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let t: Vec<i32> = time.split(':').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    if d.len() != 3 || !(2..=3).contains(&t.len()) {
        return Err(bad());
    }
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = d[0] - 1900;
    tm.tm_mon = d[1] - 1;
    tm.tm_mday = d[2];
    tm.tm_hour = t[0];
    tm.tm_min = t[1];
    tm.tm_sec = t.get(2).copied().unwrap_or(0);
    tm.tm_isdst = -1;
    // SAFETY: mktime reads and normalizes only `tm`.
    let secs = unsafe { libc::mktime(&mut tm) };
    if secs < 0 {
        return Err(bad());
    }
    Ok(secs as u64 * 1_000)
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
    let now = super::now_ms();
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
    let now = super::now_ms();
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

fn state_name(r: &Reservation, now_ms: u64) -> &'static str {
    if r.active_at(now_ms) { "ACTIVE" } else { "INACTIVE" }
}

fn nodes_text(r: &Reservation) -> String {
    if r.nodes.is_empty() { "(null)".to_string() } else { compress_hostlist(&r.nodes) }
}

fn duration_text(r: &Reservation) -> String {
    r.end_ms.map_or("UNLIMITED".to_string(), |end| format_duration(end.saturating_sub(r.start_ms) / 1_000))
}

fn or_null(list: &[String]) -> String {
    if list.is_empty() { "(null)".to_string() } else { list.join(",") }
}

/// Slurm's `scontrol show reservation` layout.
pub fn show_text(r: &Reservation, now_ms: u64) -> String {
    let flags: Vec<&str> = r.flags.iter().map(|f| f.name()).collect();
    let tres = match r.gpu_count {
        Some(g) => format!("gres/gpu={g}"),
        None => "(null)".to_string(),
    };
    format!(
        "ReservationName={} StartTime={} EndTime={} Duration={}\n   Nodes={} NodeCnt={} CoreCnt=0 Features=(null) PartitionName={} Flags={}\n   TRES={tres}\n   Users={} Groups=(null) Accounts={} Licenses=(null) State={} BurstBuffer=(null) Watts=n/a\n   MaxStartDelay=(null)\n",
        r.name,
        format_timestamp(Some(r.start_ms)),
        r.end_ms.map_or("UNLIMITED".to_string(), |e| format_timestamp(Some(e))),
        duration_text(r),
        nodes_text(r),
        r.nodes.len(),
        r.partition.clone().unwrap_or_else(|| "(null)".to_string()),
        if flags.is_empty() { "(null)".to_string() } else { flags.join(",") },
        or_null(&r.users),
        or_null(&r.accounts),
        state_name(r, now_ms),
    )
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

/// `sinfo -T`.
pub fn sinfo_table(registry: &Registry, noheader: bool) -> String {
    let mut out = String::new();
    if !noheader {
        out.push_str(&format!(
            "{:<14} {:>8} {:>19} {:>19} {:>11}  {}\n",
            "RESV_NAME", "STATE", "START_TIME", "END_TIME", "DURATION", "NODELIST"
        ));
    }
    for r in &registry.reservations {
        let nodes = match r.gpu_count {
            Some(g) => format!("(gres/gpu={g})"),
            None => nodes_text(r),
        };
        out.push_str(&format!(
            "{:<14} {:>8} {:>19} {:>19} {:>11}  {}\n",
            r.name,
            state_name(r, registry.now_ms),
            format_timestamp(Some(r.start_ms)),
            r.end_ms.map_or("UNLIMITED".to_string(), |e| format_timestamp(Some(e))),
            duration_text(r),
            nodes
        ));
    }
    out
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
        assert!(parse_start("tomorrow", now).unwrap_err().to_string().contains("Invalid time specification"));
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
