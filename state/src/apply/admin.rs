//! Administrative commands on the replicated registry of accounts, QOS, advance reservations and roles
//! (`drover account`, `drover qos`, `scontrol create/update/delete reservation`, `drover admin grant`).
//!
//! Each is checked in full before anything changes, so a refused command leaves the state as it was.

pub use crate::model::registry::{AdminOp, Object};

use crate::command::Reply;
use crate::error::CommandError;
use crate::model::account::{Account, AccountUpdate, MAX_ACCOUNT_USERS, MAX_ACCOUNTS, ROOT_ACCOUNT};
use crate::model::qos::{DEFAULT_QOS, MAX_QOS, Qos};
use crate::model::reservation::{MAX_RESERVATIONS, Reservation, ReservationUpdate};
use crate::model::role::{AdminLevel, MAX_ROLE_GRANTS, RoleGrant};
use crate::state::{Change, State};

/// Longest name of an account, QOS or reservation.
pub const MAX_NAME_BYTES: usize = 64;

fn check_name(what: &str, name: &str) -> Result<(), CommandError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(CommandError::InvalidRequest(format!(
            "invalid {what} name {name:?}: use 1 to {MAX_NAME_BYTES} letters, digits, '_', '-' or '.'"
        )))
    }
}

impl State {
    pub(crate) fn admin(
        &mut self,
        op: &AdminOp,
        by_uid: u32,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Result<Reply, CommandError> {
        let needed = match op {
            AdminOp::SetNodeSpare { .. } => AdminLevel::Operator,
            _ => AdminLevel::Administrator,
        };
        self.require_level(by_uid, needed, &op.kind().replace('_', " "))?;
        match op {
            AdminOp::AddAccount(update) => self.add_account(update, changes),
            AdminOp::ModifyAccount(update) => self.modify_account(update, changes),
            AdminOp::DeleteAccount(name) => self.delete_account(name, changes),
            AdminOp::PutQos { qos, create } => self.put_qos(qos, *create, changes),
            AdminOp::DeleteQos(name) => self.delete_qos(name, changes),
            AdminOp::CreateReservation(r) => self.create_reservation(r, now_ms, changes),
            AdminOp::UpdateReservation(u) => self.update_reservation(u, now_ms, changes),
            AdminOp::DeleteReservation(name) => {
                let r = self.reservations.remove(name).ok_or_else(|| unknown_reservation(name))?;
                changes.push(Change::DeleteObject(Object::Reservation(r).key()));
                Ok(())
            }
            AdminOp::SetRole(grant) => self.set_role(grant, changes),
            AdminOp::SetNodeSpare { names, spare } => self.set_node_spare(names, *spare, changes),
        }?;
        Ok(Reply::Nothing)
    }

    fn set_role(&mut self, grant: &RoleGrant, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        if grant.uid == 0 {
            return Err(CommandError::InvalidRequest("root is always an administrator; its role cannot change".into()));
        }
        if grant.user.len() > MAX_NAME_BYTES {
            return Err(CommandError::InvalidRequest(format!("user name longer than {MAX_NAME_BYTES} bytes")));
        }
        if grant.level == AdminLevel::None {
            if let Some(old) = self.roles.remove(&grant.uid) {
                changes.push(Change::DeleteObject(Object::Role(old).key()));
            }
            return Ok(());
        }
        if !self.roles.contains_key(&grant.uid) && self.roles.len() >= MAX_ROLE_GRANTS {
            return Err(CommandError::InvalidRequest(format!(
                "the cluster already holds {MAX_ROLE_GRANTS} role grants"
            )));
        }
        changes.push(Change::PutObject(Object::Role(grant.clone())));
        self.roles.insert(grant.uid, grant.clone());
        Ok(())
    }

    fn put_account(&mut self, account: Account, changes: &mut Vec<Change>) {
        changes.push(Change::PutObject(Object::Account(account.clone())));
        self.accounts.insert(account.name.clone(), account);
    }

    fn add_account(&mut self, update: &AccountUpdate, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        check_name("account", &update.name)?;
        if update.name == ROOT_ACCOUNT || self.accounts.contains_key(&update.name) {
            return Err(CommandError::InvalidRequest(format!("account {} already exists", update.name)));
        }
        if self.accounts.len() >= MAX_ACCOUNTS {
            return Err(CommandError::InvalidRequest(format!("the cluster already holds {MAX_ACCOUNTS} accounts")));
        }
        let parent = update.parent.clone().unwrap_or_else(|| ROOT_ACCOUNT.to_string());
        if parent != ROOT_ACCOUNT && !self.accounts.contains_key(&parent) {
            return Err(unknown_account(&parent));
        }
        let mut account = Account { name: update.name.clone(), parent: Some(parent), ..Account::default() };
        apply_account_fields(&mut account, update)?;
        self.check_account_qos(&account)?;
        if !self.accounts.contains_key(ROOT_ACCOUNT) {
            self.put_account(Account::root(), changes);
        }
        self.put_account(account, changes);
        Ok(())
    }

    fn modify_account(&mut self, update: &AccountUpdate, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        // The root account exists implicitly until an account is added: an administrator may set its QOS first.
        let implicit_root = (update.name == ROOT_ACCOUNT).then(Account::root);
        let mut account =
            self.accounts.get(&update.name).cloned().or(implicit_root).ok_or_else(|| unknown_account(&update.name))?;
        if let Some(parent) = &update.parent {
            if update.name == ROOT_ACCOUNT {
                return Err(CommandError::InvalidRequest("the root account has no parent".to_string()));
            }
            if !self.accounts.contains_key(parent) {
                return Err(unknown_account(parent));
            }
            // Walk up from the new parent: meeting the account itself would make a cycle.
            let mut at = Some(parent.clone());
            while let Some(name) = at {
                if name == update.name {
                    return Err(CommandError::InvalidRequest(format!(
                        "account {parent} is below {} in the tree: it cannot become its parent",
                        update.name
                    )));
                }
                at = self.accounts.get(&name).and_then(|a| a.parent.clone());
            }
            account.parent = Some(parent.clone());
        }
        apply_account_fields(&mut account, update)?;
        self.check_account_qos(&account)?;
        self.put_account(account, changes);
        Ok(())
    }

    /// An account's QOS list names QOS that exist, and its default QOS is one it allows.
    fn check_account_qos(&self, account: &Account) -> Result<(), CommandError> {
        if let Some(missing) = account.qos.iter().find(|q| self.qos_named(q).is_none()) {
            return Err(unknown_qos(missing));
        }
        if account.default_qos.is_empty() {
            return Ok(());
        }
        if self.qos_named(&account.default_qos).is_none() {
            return Err(unknown_qos(&account.default_qos));
        }
        let allowed = match (&account.qos, &account.parent) {
            (own, _) if !own.is_empty() => own.clone(),
            (_, Some(parent)) => self.allowed_qos(parent),
            (_, None) => vec![DEFAULT_QOS.to_string()],
        };
        if !allowed.contains(&account.default_qos) {
            return Err(CommandError::InvalidQos {
                name: account.default_qos.clone(),
                why: format!(
                    "account {} allows only QOS {}: a default QOS must be one of them",
                    account.name,
                    allowed.join(",")
                ),
            });
        }
        Ok(())
    }

    fn delete_account(&mut self, name: &str, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        if !self.accounts.contains_key(name) {
            return Err(unknown_account(name));
        }
        if name == ROOT_ACCOUNT && self.accounts.len() > 1 {
            return Err(CommandError::InvalidRequest("the root account has children".to_string()));
        }
        if let Some(child) = self.accounts.values().find(|a| a.parent.as_deref() == Some(name)) {
            return Err(CommandError::InvalidRequest(format!(
                "account {name} still has child account {}; delete or move it first",
                child.name
            )));
        }
        let active = self.jobs.values().filter(|j| j.account == name).count();
        if active > 0 {
            return Err(CommandError::InvalidRequest(format!(
                "account {name} has {active} pending or running jobs; cancel them or wait for them to end"
            )));
        }
        let account = self.accounts.remove(name).expect("checked");
        changes.push(Change::DeleteObject(Object::Account(account).key()));
        Ok(())
    }

    fn put_qos(&mut self, qos: &Qos, create: bool, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        check_name("QOS", &qos.name)?;
        let exists = self.qos.contains_key(&qos.name) || qos.name == DEFAULT_QOS;
        match (create, exists) {
            (true, true) => return Err(CommandError::InvalidRequest(format!("QOS {} already exists", qos.name))),
            (false, false) => return Err(unknown_qos(&qos.name)),
            _ => {}
        }
        if create && self.qos.len() >= MAX_QOS {
            return Err(CommandError::InvalidRequest(format!("the cluster already holds {MAX_QOS} QOS")));
        }
        changes.push(Change::PutObject(Object::Qos(qos.clone())));
        self.qos.insert(qos.name.clone(), qos.clone());
        Ok(())
    }

    fn delete_qos(&mut self, name: &str, changes: &mut Vec<Change>) -> Result<(), CommandError> {
        if name == DEFAULT_QOS {
            return Err(CommandError::InvalidRequest("QOS normal is the default and cannot be deleted".to_string()));
        }
        if !self.qos.contains_key(name) {
            return Err(unknown_qos(name));
        }
        let active = self.jobs.values().filter(|j| j.qos == name).count();
        if active > 0 {
            return Err(CommandError::InvalidRequest(format!("QOS {name} has {active} pending or running jobs")));
        }
        if let Some(a) = self.accounts.values().find(|a| a.qos.iter().any(|q| q == name) || a.default_qos == name) {
            return Err(CommandError::InvalidRequest(format!(
                "account {} allows QOS {name} (or has it as its default): take it off the account first",
                a.name
            )));
        }
        let qos = self.qos.remove(name).expect("checked");
        changes.push(Change::DeleteObject(Object::Qos(qos).key()));
        Ok(())
    }

    /// The QOS by name (`normal` exists even before anyone defines it).
    pub fn qos_named(&self, name: &str) -> Option<Qos> {
        match self.qos.get(name) {
            Some(q) => Some(q.clone()),
            None if name == DEFAULT_QOS => Some(Qos::normal()),
            None => None,
        }
    }

    fn create_reservation(
        &mut self,
        r: &Reservation,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        check_name("reservation", &r.name)?;
        if self.reservations.contains_key(&r.name) {
            return Err(CommandError::InvalidRequest(format!("reservation {} already exists", r.name)));
        }
        // Ended reservations make room: they can no longer matter to any placement.
        let ended: Vec<String> =
            self.reservations.values().filter(|x| x.ended_at(now_ms)).map(|x| x.name.clone()).collect();
        if self.reservations.len() - ended.len() >= MAX_RESERVATIONS {
            return Err(CommandError::InvalidRequest(format!(
                "the cluster already holds {MAX_RESERVATIONS} reservations"
            )));
        }
        self.check_reservation(r, now_ms)?;
        for name in ended {
            let old = self.reservations.remove(&name).expect("listed above");
            changes.push(Change::DeleteObject(Object::Reservation(old).key()));
        }
        changes.push(Change::PutObject(Object::Reservation(r.clone())));
        self.reservations.insert(r.name.clone(), r.clone());
        Ok(())
    }

    fn update_reservation(
        &mut self,
        u: &ReservationUpdate,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Result<(), CommandError> {
        let mut r = self.reservations.get(&u.name).cloned().ok_or_else(|| unknown_reservation(&u.name))?;
        if let Some(nodes) = &u.nodes {
            r.nodes = nodes.clone();
            r.gpu_count = None;
        }
        if let Some(gpus) = u.gpu_count {
            r.gpu_count = Some(gpus);
            r.nodes.clear();
        }
        if let Some(start) = u.start_ms {
            r.start_ms = start;
        }
        if u.end_open {
            r.end_ms = None;
        } else if let Some(end) = u.end_ms {
            r.end_ms = Some(end);
        }
        if let Some(users) = &u.users {
            r.users = users.clone();
        }
        if let Some(accounts) = &u.accounts {
            r.accounts = accounts.clone();
        }
        if let Some(flags) = &u.flags {
            r.flags = flags.clone();
        }
        self.check_reservation(&r, now_ms)?;
        changes.push(Change::PutObject(Object::Reservation(r.clone())));
        self.reservations.insert(r.name.clone(), r);
        Ok(())
    }

    /// A reservation must name who may use it and what it holds, end after it starts, and not overlap another
    /// reservation's nodes in time (Slurm: "Requested nodes are busy").
    fn check_reservation(&self, r: &Reservation, now_ms: u64) -> Result<(), CommandError> {
        let bad = |m: String| Err(CommandError::InvalidRequest(format!("reservation {}: {m}", r.name)));
        if r.users.is_empty() && r.accounts.is_empty() {
            return bad("name the Users= or Accounts= who may use it".to_string());
        }
        match (r.nodes.is_empty(), r.gpu_count) {
            (true, None) | (true, Some(0)) => return bad("give Nodes=, NodeCnt= or TRES=gres/gpu=N".to_string()),
            (false, Some(_)) => return bad("give either nodes or a GPU count, not both".to_string()),
            _ => {}
        }
        if let Some(end) = r.end_ms {
            if end <= r.start_ms {
                return bad("EndTime must be after StartTime".to_string());
            }
            if end <= now_ms {
                return bad("it would end in the past".to_string());
            }
        }
        for node in &r.nodes {
            if !self.nodes.contains_key(node) {
                return Err(CommandError::InvalidNodeName { name: node.clone() });
            }
        }
        if let Some(gpus) = r.gpu_count {
            let total: usize = self.nodes.values().filter(|n| n.schedulable()).map(|n| n.info.gpus.len()).sum();
            if gpus as usize > total {
                return bad(format!("{gpus} GPUs requested, the cluster has {total} schedulable"));
            }
        }
        let overlaps = |a: &Reservation, b: &Reservation| {
            a.start_ms < b.end_ms.unwrap_or(u64::MAX) && b.start_ms < a.end_ms.unwrap_or(u64::MAX)
        };
        // Against the others: an update is checked against every reservation but its own old self.
        let others = self.reservations.values().filter(|o| o.name != r.name && !o.ended_at(now_ms));
        for other in others.filter(|o| overlaps(o, r)) {
            if let Some(node) = r.nodes.iter().find(|n| other.nodes.contains(n)) {
                return bad(format!("Requested nodes are busy: {node} is in reservation {} at that time", other.name));
            }
        }
        Ok(())
    }
}

fn apply_account_fields(account: &mut Account, update: &AccountUpdate) -> Result<(), CommandError> {
    if let Some(shares) = update.shares {
        if shares == 0 {
            return Err(CommandError::InvalidRequest("fairshare must be at least 1".to_string()));
        }
        account.shares = shares;
    }
    if let Some(d) = &update.description {
        account.description = d.clone();
    }
    for user in &update.add_users {
        if !account.users.contains(user) {
            account.users.push(user.clone());
        }
    }
    account.users.retain(|u| !update.remove_users.contains(u));
    account.users.sort();
    if let Some(qos) = &update.qos {
        if qos.len() > MAX_QOS {
            return Err(CommandError::InvalidRequest(format!("an account lists at most {MAX_QOS} QOS")));
        }
        account.qos = qos.clone();
        account.qos.sort();
        account.qos.dedup();
    }
    if let Some(default) = &update.default_qos {
        account.default_qos = default.clone();
    }
    if account.users.len() > MAX_ACCOUNT_USERS {
        return Err(CommandError::InvalidRequest(format!("an account lists at most {MAX_ACCOUNT_USERS} users")));
    }
    Ok(())
}

fn unknown_account(name: &str) -> CommandError {
    CommandError::InvalidAccount { name: name.to_string(), why: "no such account".to_string() }
}

fn unknown_qos(name: &str) -> CommandError {
    CommandError::InvalidQos { name: name.to_string(), why: "no such QOS".to_string() }
}

fn unknown_reservation(name: &str) -> CommandError {
    CommandError::InvalidReservation { name: name.to_string(), why: "no such reservation".to_string() }
}
