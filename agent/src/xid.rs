//! NVIDIA's XID catalog as a remedy per error: restart the application, reset the GPU, reboot the node, or replace
//! the hardware. The built-in table follows NVIDIA's "XID Errors" catalog (its resolution column, r550 drivers);
//! an operator overrides any line with `xid_actions = "/etc/drover/xid-actions"` in the agent's config, one
//! `XID ACTION` per line (`#` comments), ACTION one of `ignore`, `restart_app`, `reset_gpu`, `reboot_node`,
//! `hardware`.

use std::collections::BTreeMap;
use std::path::Path;

use drover_state::node::XidAction;

/// The built-in table: (XID, remedy, what it means).
const BUILT_IN: &[(u64, XidAction, &str)] = &[
    (13, XidAction::RestartApp, "graphics engine exception (usually the application)"),
    (31, XidAction::RestartApp, "GPU memory page fault (usually the application)"),
    (43, XidAction::RestartApp, "GPU stopped processing (the application's context was reset)"),
    (45, XidAction::Ignore, "preemptive cleanup after an earlier error"),
    (48, XidAction::ResetGpu, "double-bit ECC error"),
    (61, XidAction::ResetGpu, "internal micro-controller breakpoint"),
    (62, XidAction::ResetGpu, "internal micro-controller halt"),
    (63, XidAction::ResetGpu, "ECC page retirement or row remapping pending"),
    (64, XidAction::Hardware, "ECC page retirement or row remapping failure"),
    (74, XidAction::ResetGpu, "NVLink error"),
    (79, XidAction::RebootNode, "GPU has fallen off the bus"),
    (92, XidAction::ResetGpu, "high single-bit ECC error rate"),
    (94, XidAction::RestartApp, "contained ECC error (only the application that read it is affected)"),
    (95, XidAction::ResetGpu, "uncontained ECC error"),
    (109, XidAction::RestartApp, "context switch timeout"),
    (119, XidAction::ResetGpu, "GSP RPC timeout"),
    (120, XidAction::ResetGpu, "GSP error"),
    (121, XidAction::ResetGpu, "C2C link error"),
    (140, XidAction::ResetGpu, "unrecovered ECC error"),
    (143, XidAction::Hardware, "GPU initialization failure"),
    (154, XidAction::RebootNode, "GPU recovery action changed (the driver asks for a node reboot or more)"),
];

/// The remedy per XID the agent applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidTable {
    actions: BTreeMap<u64, (XidAction, String)>,
}

/// A line of the operator's table that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum XidTableError {
    #[error("cannot read the XID table {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error(
        "{path}:{line}: {why} (expected `XID ACTION`, ACTION one of ignore, restart_app, reset_gpu, reboot_node, hardware)"
    )]
    Line { path: String, line: usize, why: String },
}

/// The longest override file read.
const MAX_TABLE_BYTES: u64 = 64 * 1024;

impl Default for XidTable {
    fn default() -> Self {
        XidTable { actions: BUILT_IN.iter().map(|(xid, action, what)| (*xid, (*action, what.to_string()))).collect() }
    }
}

impl XidTable {
    /// The built-in table with the operator's file (if any) on top.
    pub fn load(overrides: Option<&Path>) -> Result<XidTable, XidTableError> {
        let mut table = XidTable::default();
        let Some(path) = overrides else { return Ok(table) };
        let shown = path.display().to_string();
        let text = std::fs::read(path)
            .map_err(|source| XidTableError::Read { path: shown.clone(), source })?
            .into_iter()
            .take(MAX_TABLE_BYTES as usize)
            .collect::<Vec<u8>>();
        let text = String::from_utf8_lossy(&text);
        table.apply(&text, &shown)?;
        Ok(table)
    }

    fn apply(&mut self, text: &str, path: &str) -> Result<(), XidTableError> {
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: String| XidTableError::Line { path: path.to_string(), line: n + 1, why };
            let mut words = line.split_whitespace();
            let (Some(xid), Some(action), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad(format!("{line:?} is not two words")));
            };
            let xid: u64 = xid.parse().map_err(|_| bad(format!("{xid:?} is not an XID number")))?;
            let action = XidAction::parse(action).ok_or_else(|| bad(format!("{action:?} is not an action")))?;
            let what = self.actions.get(&xid).map_or_else(|| "set by the operator".to_string(), |(_, w)| w.clone());
            self.actions.insert(xid, (action, what));
        }
        Ok(())
    }

    /// The remedy for `xid` and what it means. An XID the table does not name is logged and ignored, as before the
    /// table existed: an unknown code is not evidence enough to take a GPU away.
    pub fn classify(&self, xid: u64) -> (XidAction, &str) {
        match self.actions.get(&xid) {
            Some((action, what)) => (*action, what.as_str()),
            None => (XidAction::Ignore, "not in the XID table"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_of_the_catalog_has_its_remedy() {
        let table = XidTable::default();
        assert_eq!(table.classify(13).0, XidAction::RestartApp);
        assert_eq!(table.classify(48).0, XidAction::ResetGpu);
        assert_eq!(table.classify(79).0, XidAction::RebootNode);
        assert_eq!(table.classify(64).0, XidAction::Hardware);
        assert_eq!(table.classify(45).0, XidAction::Ignore);
        assert_eq!(table.classify(99_999).0, XidAction::Ignore, "unknown codes take nothing away");
    }

    #[test]
    fn an_operator_overrides_lines_and_a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xid");
        std::fs::write(&path, "# site policy\n79 hardware   # our H200s never come back\n13 ignore\n999 reset_gpu\n")
            .unwrap();
        let table = XidTable::load(Some(&path)).unwrap();
        assert_eq!(table.classify(79), (XidAction::Hardware, "GPU has fallen off the bus"));
        assert_eq!(table.classify(13).0, XidAction::Ignore);
        assert_eq!(table.classify(999), (XidAction::ResetGpu, "set by the operator"));
        assert_eq!(table.classify(48).0, XidAction::ResetGpu, "lines not overridden keep the built-in remedy");

        std::fs::write(&path, "79 reboot_node\n48 replace\n").unwrap();
        let err = XidTable::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains(":2:") && err.contains("\"replace\" is not an action"), "{err}");
        let err = XidTable::load(Some(&dir.path().join("missing"))).unwrap_err().to_string();
        assert!(err.contains("cannot read the XID table"), "{err}");
    }
}
