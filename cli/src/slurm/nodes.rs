//! A node as Slurm's commands print it (`scontrol show node`, `sinfo`): its complete state and its GRES.

use drover_state::{Node, NodeHealth};

/// Slurm's complete node state (`IDLE`, `MIXED+DRAIN`, `DOWN+NOT_RESPONDING`, ...).
pub fn node_state(node: &Node) -> String {
    let base = match node.state_name() {
        "DRAINED" => "IDLE",
        "DRAINING" if node.allocated_gpus.len() == node.info.gpus.len() && !node.info.gpus.is_empty() => "ALLOCATED",
        "DRAINING" => "MIXED",
        other => other,
    };
    // Slurm's flag for a node with `scontrol reboot` pending.
    let reboot = if node.reboot.is_some() { "+REBOOT_REQUESTED" } else { "" };
    match (node.health, node.drain) {
        (NodeHealth::Down, true) => format!("DOWN+DRAIN+NOT_RESPONDING{reboot}"),
        (NodeHealth::Down, false) => format!("DOWN+NOT_RESPONDING{reboot}"),
        (NodeHealth::Up, true) => format!("{base}+DRAIN{reboot}"),
        (NodeHealth::Up, false) => format!("{base}{reboot}"),
    }
}

/// `Gres=` of a node: `gpu:h200:8` (or `gpu:8`), `(null)` without GPUs.
pub fn node_gres(node: &Node) -> String {
    let info = &node.info;
    match (info.gpus.len(), info.gpu_type.as_str()) {
        (0, _) => "(null)".to_string(),
        (n, "") => format!("gpu:{n}"),
        (n, t) => format!("gpu:{t}:{n}"),
    }
}

/// `GresUsed=`: `gpu:h200:2(IDX:0-1)`, `gpu:h200:0(IDX:N/A)` when none is held.
pub fn node_gres_used(node: &Node) -> String {
    let info = &node.info;
    if info.gpus.is_empty() {
        return "(null)".to_string();
    }
    let held: Vec<u32> = info.gpus.iter().map(|g| g.index).filter(|i| node.gpu_held(*i)).collect();
    let prefix = if info.gpu_type.is_empty() { "gpu".to_string() } else { format!("gpu:{}", info.gpu_type) };
    let idx = if held.is_empty() { "N/A".to_string() } else { drover_common::ranges::format_ranges(&held) };
    format!("{prefix}:{}(IDX:{idx})", held.len())
}
