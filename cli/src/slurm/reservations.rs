//! Advance reservations as Slurm prints them: `scontrol show reservation` records and `sinfo -T`'s table.

use drover_proto::wire::Registry;
use drover_state::Reservation;
use drover_state::hostlist::compress_hostlist;
use drover_state::slurm_time::format_duration;

use crate::format::format_timestamp;

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
