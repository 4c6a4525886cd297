//! `sacctmgr list|show user|account|association`: the replicated accounts as Slurm's associations, read-only.
//!
//! Client libraries ask `sacctmgr` which accounts a user may charge before they submit (snakemake's Slurm
//! executor runs `sacctmgr -n -s list user NAME format=account%256` to check `slurm_account`), so it answers as
//! Slurm 23's does: the same option letters, entity and field abbreviations, `where`/`format=` words, widths,
//! `+`-cut columns and `-p`/`-P` layouts. Changes go through `drover account|qos|admin`, which commit them.
//!
//! How Drover's model reads as associations:
//! - each account of the fair-share tree (as `sshare` shows it, so the implicit `root` and, with no tree
//!   defined, the accounts jobs named) is an account association, `Share` its raw shares;
//! - a user has an association with every account that admits them: one listing them, or one listing no users
//!   (open to everyone). Users have no shares of their own, they share their account's (Slurm's `parent`);
//! - the default account is the one a job without `--account` charges: the first account (by name) listing the
//!   user, else `root`;
//! - an association's `QOS` is what jobs charging its account may use: the account's own list, else its nearest
//!   ancestor's, else `normal` (the controllers enforce it at submit); `Def QOS` likewise. Limits live on QOS, so
//!   the association limit columns are empty;
//! - the users shown, when none are named, are those named in account lists or roles, and the caller. A named
//!   user is shown when Drover knows them so or this host's passwd database does (any such user may submit).

use std::collections::{BTreeMap, BTreeSet};

use drover_state::{AdminLevel, RoleGrant};

/// Users listed at most when none are named (each named in an account list or a role).
const MAX_USERS: usize = 10_000;
/// Rows listed at most: every user may hold an association with every account, so their product is bounded too.
const MAX_ROWS: usize = 100_000;

pub fn run(args: &[String]) -> i32 {
    crate::command::finish(
        "sacctmgr",
        sacctmgr(args).map(|out| {
            print!("{out}");
            0
        }),
    )
}

fn sacctmgr(args: &[String]) -> anyhow::Result<String> {
    let (controllers, args) = crate::command::take_controllers_flag(args);
    let command = parse(&args)?;
    let query = match command {
        Command::Version => return Ok(format!("{}\n", crate::format::version_line())),
        Command::Help => return Ok(USAGE.to_string()),
        Command::Show(query) => query,
    };
    let client = crate::connect::client(controllers.as_deref())?;
    let rt = crate::connect::runtime();
    let registry = rt.block_on(client.registry(false))?;
    let cluster = rt.block_on(client.nodes_and_config(false))?.1.map(|c| c.cluster_name).unwrap_or_default();
    let snapshot = Snapshot::new(&registry, cluster, crate::identity::current_user().0);
    let (out, cut) = snapshot.render(&query, &|name| crate::identity::user_uid(name).is_some())?;
    if cut {
        eprintln!("sacctmgr: warning: output cut at {MAX_ROWS} rows; narrow it with Users=, Accounts= or names");
    }
    Ok(out)
}

/// What the command line asks for.
#[derive(Debug)]
enum Command {
    Version,
    Help,
    Show(Query),
}

const USAGE: &str =
    "Usage: sacctmgr [-n] [-p|-P] [-s] {list|show} {user|account|association} [where] [CONDITION=VALUE...] \
[format=FIELD[%WIDTH],...]
Drover's sacctmgr reads the replicated accounts as Slurm's associations. Changes: drover account|qos|admin.
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entity {
    User,
    Account,
    Association,
}

#[derive(Debug, Default)]
struct Layout {
    noheader: bool,
    /// `-p`: every value followed by `|`; `-P`: none after the last.
    parsable: Option<bool>,
}

#[derive(Debug)]
struct Query {
    entity: Entity,
    layout: Layout,
    /// `-s` / `WithAssoc`: users and accounts with their associations.
    with_assoc: bool,
    /// Account names (accounts: bare words, `Names=`, `Accounts=`); for users and associations `Accounts=`.
    accounts: Vec<String>,
    /// User names (users: bare words, `Names=`, `Users=`; others: `Users=`).
    users: Vec<String>,
    clusters: Vec<String>,
    partitions: Vec<String>,
    default_accounts: Vec<String>,
    descriptions: Vec<String>,
    organizations: Vec<String>,
    /// `OnlyDefaults`: only each user's default association.
    only_defaults: bool,
    /// `Tree`: account names indented by depth.
    tree: bool,
    /// `WOPLimits`/`WOPInfo`: the default format without the limit columns.
    without_limits: bool,
    format: Vec<String>,
}

/// `xstrncasecmp(name, word, MAX(strlen(word), min))`: `word` abbreviates `name`, with at least `min` letters.
fn abbreviates(word: &str, name: &str, min: usize) -> bool {
    word.len() >= min.min(name.len()) && word.len() <= name.len() && name[..word.len()].eq_ignore_ascii_case(word)
}

/// Splits `a,b` lists as Slurm does (empty items dropped).
fn list(value: &str) -> Vec<String> {
    value.split(',').map(str::trim).filter(|v| !v.is_empty()).map(str::to_string).collect()
}

fn parse(args: &[String]) -> anyhow::Result<Command> {
    let mut layout = Layout::default();
    let mut with_assoc = false;
    let mut words = Vec::new();
    // Options may come anywhere (getopt permutes), as long as they start with `-`.
    for arg in args {
        let flags: Vec<char> = match arg.strip_prefix("--") {
            Some("noheader") => vec!['n'],
            Some("parsable") => vec!['p'],
            Some("parsable2") => vec!['P'],
            Some("associations") => vec!['s'],
            Some("immediate") => vec!['i'],
            Some("quiet") => vec!['Q'],
            Some("readonly") => vec!['r'],
            Some("verbose") => vec!['v'],
            Some("oneliner") => vec!['o'],
            Some("version") => vec!['V'],
            Some("help" | "usage") => vec!['h'],
            Some(other) => anyhow::bail!("unrecognized option '--{other}'"),
            None if arg.len() > 1 && arg.starts_with('-') => arg[1..].chars().collect(),
            None => {
                words.push(arg.as_str());
                continue;
            }
        };
        for flag in flags {
            match flag {
                'n' => layout.noheader = true,
                'p' => layout.parsable = Some(true),
                'P' => layout.parsable = Some(false),
                's' => with_assoc = true,
                'V' => return Ok(Command::Version),
                'h' => return Ok(Command::Help),
                // Nothing is committed, nothing asked, nothing extra said: these change nothing here.
                'i' | 'Q' | 'r' | 'v' | 'o' => {}
                other => anyhow::bail!("invalid option -- '{other}'"),
            }
        }
    }
    let Some((verb, rest)) = words.split_first() else {
        anyhow::bail!("no command given: Drover's sacctmgr runs one `list` or `show` command (no interactive mode)");
    };
    if abbreviates(verb, "version", 4) {
        return Ok(Command::Version);
    }
    if abbreviates(verb, "help", 2) {
        return Ok(Command::Help);
    }
    if !abbreviates(verb, "show", 3) && !abbreviates(verb, "list", 3) {
        let change =
            ["add", "create", "modify", "delete", "remove", "archive", "load", "dump", "reconfigure", "shutdown"]
                .iter()
                .any(|c| abbreviates(verb, c, 3));
        if change {
            anyhow::bail!(
                "Drover's sacctmgr only reads (list/show): change accounts with `drover account`, QOS with \
                 `drover qos` and administrative levels with `drover admin`"
            );
        }
        anyhow::bail!("Invalid input: {verb}");
    }
    let Some((entity, conditions)) = rest.split_first() else {
        anyhow::bail!("No valid entity in list command");
    };
    let entity = if abbreviates(entity, "Accounts", 2) || abbreviates(entity, "Acct", 4) {
        Entity::Account
    } else if abbreviates(entity, "Associations", 2) {
        Entity::Association
    } else if abbreviates(entity, "Users", 1) {
        Entity::User
    } else {
        anyhow::bail!(
            "No valid entity in list command: Drover's sacctmgr lists Account, Association and User \
             (QOS: `drover qos list`; clusters, partitions and nodes: `sinfo`, `scontrol show`)"
        );
    };
    let mut query = Query {
        entity,
        layout,
        with_assoc,
        accounts: Vec::new(),
        users: Vec::new(),
        clusters: Vec::new(),
        partitions: Vec::new(),
        default_accounts: Vec::new(),
        descriptions: Vec::new(),
        organizations: Vec::new(),
        only_defaults: false,
        tree: false,
        without_limits: false,
        format: Vec::new(),
    };
    for word in conditions {
        condition(&mut query, word)?;
    }
    Ok(Command::Show(query))
}

/// One `KEY=VALUE` (or bare) word after the entity, as each entity's `_set_cond` reads it.
fn condition(q: &mut Query, word: &str) -> anyhow::Result<()> {
    let (key, value) = match word.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (word, None),
    };
    if key.ends_with(['+', '-']) && value.is_some() {
        anyhow::bail!("Invalid operator '{}=' in {word}", &key[key.len() - 1..]);
    }
    let is = |name: &str, min: usize| abbreviates(key, name, min);
    let Some(value) = value else {
        match q.entity {
            _ if is("where", 5) => {}
            Entity::User | Entity::Account if is("WithAssoc", 5) => q.with_assoc = true,
            Entity::Association if is("OnlyDefaults", 1) => q.only_defaults = true,
            Entity::Association if is("Tree", 1) => q.tree = true,
            Entity::Association if is("WOPInfo", 4) || is("WOPLimits", 4) || is("WOLimits", 3) => {
                q.without_limits = true
            }
            Entity::User | Entity::Account if is("WOPLimits", 4) => q.without_limits = true,
            // No deleted records are kept, so there are none to add.
            _ if is("WithDeleted", 5) => {}
            Entity::User => q.users.push(word.to_string()),
            Entity::Account => q.accounts.push(word.to_string()),
            Entity::Association => anyhow::bail!("Unknown condition: {word} (Drover's associations have no ids)"),
        }
        return Ok(());
    };
    match q.entity {
        _ if is("Format", 1) => q.format.extend(list(value)),
        _ if is("Clusters", 1) => q.clusters.extend(list(value)),
        _ if is("Partitions", 4) => q.partitions.extend(list(value)),
        Entity::User if is("Names", 1) || is("Users", 1) => q.users.extend(list(value)),
        Entity::User if is("DefaultAccount", 8) => q.default_accounts.extend(list(value)),
        Entity::Account if is("Names", 1) || is("Accounts", 2) || is("Acct", 4) => q.accounts.extend(list(value)),
        Entity::Account if is("Descriptions", 1) => q.descriptions.extend(list(value)),
        Entity::Account if is("Organizations", 1) => q.organizations.extend(list(value)),
        _ if is("Accounts", 2) || is("Acct", 4) => q.accounts.extend(list(value)),
        _ if is("Users", 1) => q.users.extend(list(value)),
        _ => anyhow::bail!("Unknown condition: {word}"),
    }
    Ok(())
}

/// One account of the tree, with what associations need from it.
#[derive(Debug, Clone)]
struct AccountRow {
    name: String,
    parent: Option<String>,
    depth: u32,
    shares: u32,
    /// Empty: open to every user.
    users: Vec<String>,
    description: String,
    /// The QOS its jobs may use (inherited; comma-separated) and their default when they name none (empty: unset).
    qos: String,
    default_qos: String,
}

impl AccountRow {
    fn admits(&self, user: &str) -> bool {
        self.users.is_empty() || self.users.iter().any(|u| u == user)
    }
}

/// The replicated state `sacctmgr` reads, taken once.
struct Snapshot {
    cluster: String,
    /// In tree order (depth-first, siblings by name), as `sshare` prints them.
    accounts: Vec<AccountRow>,
    /// Whether accounts are defined (otherwise every job charges `root` unless it names one, which is accepted).
    defined: bool,
    levels: BTreeMap<String, AdminLevel>,
    caller: String,
}

impl Snapshot {
    fn new(registry: &drover_proto::wire::Registry, cluster: String, caller: String) -> Snapshot {
        let accounts = registry
            .shares
            .iter()
            .map(|row| {
                let defined = registry.accounts.iter().find(|a| a.name == row.account);
                let inherited = |pick: fn(&drover_state::Account) -> Option<String>| {
                    let mut at = defined;
                    for _ in 0..=registry.accounts.len() {
                        let a = at?;
                        if let Some(v) = pick(a) {
                            return Some(v);
                        }
                        at = a.parent.as_deref().and_then(|p| registry.accounts.iter().find(|x| x.name == p));
                    }
                    None
                };
                let mut qos = inherited(|a| (!a.qos.is_empty()).then(|| a.qos.join(",")))
                    .unwrap_or_else(|| drover_state::DEFAULT_QOS.to_string());
                if qos.contains(',') {
                    let mut names: Vec<&str> = qos.split(',').collect();
                    names.sort_unstable();
                    qos = names.join(",");
                }
                AccountRow {
                    name: row.account.clone(),
                    parent: row.parent.clone(),
                    depth: row.depth,
                    shares: row.raw_shares,
                    users: defined.map(|a| a.users.clone()).unwrap_or_default(),
                    description: defined.map(|a| a.description.clone()).unwrap_or_default(),
                    default_qos: inherited(|a| (!a.default_qos.is_empty()).then(|| a.default_qos.clone()))
                        .unwrap_or_default(),
                    qos,
                }
            })
            .collect();
        Snapshot { cluster, accounts, defined: !registry.accounts.is_empty(), levels: levels(&registry.roles), caller }
    }

    /// The account a job of `user` charges without `--account` (the controller's `resolve_account`).
    fn default_account(&self, user: &str) -> String {
        let mut listing: Vec<&AccountRow> = self
            .accounts
            .iter()
            .filter(|a| {
                self.defined && a.name != drover_state::account::ROOT_ACCOUNT && a.users.iter().any(|u| u == user)
            })
            .collect();
        listing.sort_by(|a, b| a.name.cmp(&b.name));
        listing.first().map_or_else(|| drover_state::account::ROOT_ACCOUNT.to_string(), |a| a.name.clone())
    }

    /// The users a query shows (sorted): the named ones Drover or passwd knows, or everyone Drover knows by name.
    fn users(&self, named: &[String], exists: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut known: BTreeSet<&str> = self.accounts.iter().flat_map(|a| a.users.iter().map(String::as_str)).collect();
        known.extend(self.levels.keys().map(String::as_str));
        known.insert(&self.caller);
        if named.is_empty() {
            return known.into_iter().take(MAX_USERS).map(str::to_string).collect();
        }
        let chosen: BTreeSet<&str> =
            named.iter().map(String::as_str).filter(|n| known.contains(n) || exists(n)).collect();
        chosen.into_iter().map(str::to_string).collect()
    }

    /// The listing, and whether it was cut at [`MAX_ROWS`].
    fn render(&self, q: &Query, exists: &dyn Fn(&str) -> bool) -> anyhow::Result<(String, bool)> {
        let default_format = match (q.entity, q.with_assoc) {
            (Entity::User, false) => "User,DefaultAccount,AdminLevel".to_string(),
            (Entity::User, true) => "User,DefaultAccount,AdminLevel,Cluster,Account,Partition,Share,Priority,\
                 MaxJobs,MaxNodes,MaxCPUs,MaxSubmit,MaxWall,MaxCPUMins,QOS,DefaultQOS"
                .to_string(),
            (Entity::Account, false) => "Account,Description,Organization".to_string(),
            (Entity::Account, true) => "Account,Description,Organization,Cluster,ParentName,User,Share,Priority,\
                 GrpJobs,GrpNodes,GrpCPUs,GrpMemory,GrpSubmit,GrpWall,GrpCPUMins,MaxJobs,MaxNodes,MaxCPUs,\
                 MaxSubmit,MaxWall,MaxCPUMins,QOS,DefaultQOS"
                .to_string(),
            (Entity::Association, _) if q.without_limits => "Cluster,Account,User,Partition".to_string(),
            (Entity::Association, _) => "Cluster,Account,User,Partition,Share,Priority,GrpJobs,GrpTRES,\
                 GrpSubmit,GrpWall,GrpTRESMins,MaxJobs,MaxTRES,MaxTRESPerNode,MaxSubmit,MaxWall,MaxTRESMins,QOS,\
                 DefaultQOS,GrpTRESRunMins"
                .to_string(),
        };
        let spec = if q.format.is_empty() { list(&default_format) } else { q.format.clone() };
        let tree = q.tree && q.entity == Entity::Association;
        let fields = spec.iter().map(|f| field(f, tree)).collect::<anyhow::Result<Vec<_>>>()?;
        let (rows, cut) = self.rows(q, exists);
        let mut out = String::new();
        if !q.layout.noheader {
            out.push_str(&crate::slurm::fields::header(&fields, &layout(q.layout.parsable)));
        }
        for row in &rows {
            let values: Vec<String> = fields.iter().map(|f| self.value(f.def.name, row, tree)).collect();
            out.push_str(&crate::slurm::fields::row(&fields, &values, &layout(q.layout.parsable)));
        }
        Ok((out, cut))
    }

    /// The rows, in Slurm's order: users by name; accounts by name; associations in tree order, each account's
    /// own before its users'. Cut at [`MAX_ROWS`] (the flag says so).
    fn rows<'a>(&'a self, q: &Query, exists: &dyn Fn(&str) -> bool) -> (Vec<Row<'a>>, bool) {
        let want = |list: &[String], value: &str| list.is_empty() || list.iter().any(|v| v.eq_ignore_ascii_case(value));
        // Drover's associations belong to its one cluster and name no partition.
        if !want(&q.clusters, &self.cluster) || !q.partitions.is_empty() {
            return (Vec::new(), false);
        }
        let of = |user: &str| -> Vec<&'a AccountRow> {
            self.accounts.iter().filter(|a| a.admits(user) && want(&q.accounts, &a.name)).collect()
        };
        let mut rows = Vec::new();
        match q.entity {
            Entity::User => {
                for user in self.users(&q.users, exists) {
                    if rows.len() > MAX_ROWS {
                        break;
                    }
                    let default = self.default_account(&user);
                    if !want(&q.default_accounts, &default) {
                        continue;
                    }
                    let assocs = of(&user);
                    if q.with_assoc {
                        rows.extend(assocs.into_iter().map(|a| Row { user: Some(user.clone()), account: Some(a) }));
                    } else if q.accounts.is_empty() || !assocs.is_empty() {
                        rows.push(Row { user: Some(user), account: None });
                    }
                }
            }
            Entity::Account => {
                let mut accounts: Vec<&AccountRow> = self
                    .accounts
                    .iter()
                    .filter(|a| want(&q.accounts, &a.name))
                    .filter(|a| want(&q.descriptions, &self.description(a)))
                    .filter(|a| want(&q.organizations, &self.organization(a)))
                    .collect();
                accounts.sort_by(|a, b| a.name.cmp(&b.name));
                let users = self.users(&q.users, exists);
                for account in accounts {
                    if rows.len() > MAX_ROWS {
                        break;
                    }
                    if !q.with_assoc {
                        rows.push(Row { user: None, account: Some(account) });
                        continue;
                    }
                    if q.users.is_empty() {
                        rows.push(Row { user: None, account: Some(account) });
                    }
                    rows.extend(
                        users
                            .iter()
                            .filter(|u| account.admits(u))
                            .map(|u| Row { user: Some(u.clone()), account: Some(account) }),
                    );
                }
            }
            Entity::Association => {
                let users = self.users(&q.users, exists);
                for account in self.accounts.iter().filter(|a| want(&q.accounts, &a.name)) {
                    if rows.len() > MAX_ROWS {
                        break;
                    }
                    if q.users.is_empty() && !q.only_defaults {
                        rows.push(Row { user: None, account: Some(account) });
                    }
                    for user in users.iter().filter(|u| account.admits(u)) {
                        if !q.only_defaults || self.default_account(user) == account.name {
                            rows.push(Row { user: Some(user.clone()), account: Some(account) });
                        }
                    }
                }
            }
        }
        let cut = rows.len() > MAX_ROWS;
        rows.truncate(MAX_ROWS);
        (rows, cut)
    }

    /// An account's `Descr`: its description, else (as `sacctmgr add account` fills it in) its name.
    fn description(&self, a: &AccountRow) -> String {
        match (a.description.is_empty(), a.parent.is_none()) {
            (false, _) => a.description.clone(),
            (true, true) => "default root account".to_string(),
            (true, false) => a.name.clone(),
        }
    }

    /// An account's `Org`: as `sacctmgr add account` fills it in, the account under root it descends from.
    fn organization(&self, a: &AccountRow) -> String {
        let mut current = a;
        // Bounded by the tree's depth; a parent missing from the rows ends the walk.
        for _ in 0..=self.accounts.len() {
            let Some(parent) = current.parent.as_deref() else { return current.name.clone() };
            match self.accounts.iter().find(|p| p.name == parent) {
                Some(p) if p.parent.is_some() => current = p,
                _ => return current.name.clone(),
            }
        }
        current.name.clone()
    }

    fn value(&self, field: &str, row: &Row, tree: bool) -> String {
        let user = row.user.as_deref();
        let account = row.account;
        match (field, user, account) {
            ("Account", _, Some(a)) if tree => {
                format!("{}{}", " ".repeat((a.depth + u32::from(user.is_some())) as usize), a.name)
            }
            ("Account", _, Some(a)) => a.name.clone(),
            ("Admin", Some(u), _) => self.levels.get(u).copied().unwrap_or_default().name().to_string(),
            ("Cluster", _, Some(_)) => self.cluster.clone(),
            ("Def Acct", Some(u), _) => self.default_account(u),
            ("Descr", _, Some(a)) => self.description(a),
            ("Org", _, Some(a)) => self.organization(a),
            ("ParentName", None, Some(a)) => a.parent.clone().unwrap_or_default(),
            ("QOS", _, Some(a)) => a.qos.clone(),
            ("Def QOS", _, Some(a)) => a.default_qos.clone(),
            ("Share", None, Some(a)) => a.shares.to_string(),
            // Users have no shares of their own: they share their account's, as Slurm's Fairshare=parent.
            ("Share", Some(_), Some(_)) => "parent".to_string(),
            ("User", Some(u), _) => u.to_string(),
            _ => String::new(),
        }
    }
}

/// Administrative levels by user name: the grants, and root (uid 0), always an administrator.
fn levels(roles: &[RoleGrant]) -> BTreeMap<String, AdminLevel> {
    let mut levels: BTreeMap<String, AdminLevel> = roles.iter().map(|g| (g.user.clone(), g.level)).collect();
    if let Some(root) = crate::identity::user_name(0) {
        levels.insert(root, AdminLevel::Administrator);
    }
    levels
}

struct Row<'a> {
    user: Option<String>,
    account: Option<&'a AccountRow>,
}

/// A field `sacctmgr` knows: what its abbreviations must spell, its header and default width.
struct FieldDef {
    spellings: &'static [(&'static str, usize)],
    name: &'static str,
    width: i32,
}

const fn def(spellings: &'static [(&'static str, usize)], name: &'static str, width: i32) -> FieldDef {
    FieldDef { spellings, name, width }
}

/// The association, account and user fields of sacctmgr's `_get_print_field`, in its order (the first match
/// wins). Those Drover has no value for print empty, as unset ones do in Slurm.
const FIELDS: &[FieldDef] = &[
    def(&[("Account", 3), ("Acct", 4)], "Account", 10),
    def(&[("AdminLevel", 2)], "Admin", 9),
    def(&[("Clusters", 2)], "Cluster", 10),
    def(&[("Coordinators", 3)], "Coord Accounts", 20),
    def(&[("DefaultAccount", 8)], "Def Acct", 10),
    def(&[("DefaultQOS", 8)], "Def QOS", 9),
    def(&[("DefaultWCKey", 8)], "Def WCKey", 10),
    def(&[("Description", 3)], "Descr", 20),
    def(&[("Flags", 2)], "Flags", 20),
    def(&[("GrpCPUs", 6)], "GrpCPUs", 8),
    def(&[("GrpCPUMins", 7)], "GrpCPUMins", 11),
    def(&[("GrpCPURunMins", 7)], "GrpCPURunMins", 13),
    def(&[("GrpTRES", 7)], "GrpTRES", 13),
    def(&[("GrpTRESMins", 7)], "GrpTRESMins", 13),
    def(&[("GrpTRESRunMins", 7)], "GrpTRESRunMins", 13),
    def(&[("GrpJobs", 4)], "GrpJobs", 7),
    def(&[("GrpJobsAccrue", 8)], "GrpJobsAccrue", 13),
    def(&[("GrpMemory", 4)], "GrpMem", 7),
    def(&[("GrpNodes", 4)], "GrpNodes", 8),
    def(&[("GrpSubmitJobs", 4)], "GrpSubmit", 9),
    def(&[("GrpWall", 4)], "GrpWall", 11),
    def(&[("ID", 2)], "ID", 6),
    def(&[("Lineage", 1)], "Lineage", -20),
    def(&[("MaxCPUMinsPerJob", 7)], "MaxCPUMins", 11),
    def(&[("MaxCPURunMinsPerUser", 7), ("MaxCPURunMinsPU", 7)], "MaxCPURunMinsPU", 15),
    def(&[("MaxCPUsPerJob", 7)], "MaxCPUs", 8),
    def(&[("MaxCPUsPerUser", 11), ("MaxCPUsPU", 9)], "MaxCPUsPU", 9),
    def(&[("MaxTRES", 7), ("MaxTRESPJ", 9), ("MaxTRESPerJob", 11)], "MaxTRES", 13),
    def(&[("MaxTRESPerNode", 11), ("MaxTRESPN", 9)], "MaxTRESPerNode", 14),
    def(&[("MaxTRESMinsPerJob", 8), ("MaxTRESMinsPJ", 13)], "MaxTRESMins", 13),
    def(&[("MaxTRESRunMinsPerUser", 8), ("MaxTRESRunMinsPU", 8)], "MaxTRESRunMinsPU", 16),
    def(&[("MaxJobs", 4)], "MaxJobs", 7),
    def(&[("MaxJobsAccrue", 4)], "MaxJobsAccrue", 13),
    def(&[("MaxNodesPerJob", 4)], "MaxNodes", 8),
    def(&[("MaxSubmitJobs", 4)], "MaxSubmit", 9),
    def(&[("MaxWallDurationPerJob", 4)], "MaxWall", 11),
    def(&[("MinCPUsPerJob", 7)], "MinCPUs", 8),
    def(&[("Organization", 1)], "Org", 20),
    def(&[("ParentID", 7)], "ParentID", 8),
    def(&[("ParentName", 7)], "ParentName", 10),
    def(&[("Partition", 4)], "Partition", 10),
    def(&[("Priority", 3)], "Priority", 10),
    def(&[("QOSLevel", 3)], "QOS", 20),
    def(&[("QOSRAWLevel", 4)], "QOS_RAW", 10),
    def(&[("Share", 1), ("FairShare", 2)], "Share", 9),
    def(&[("User", 1)], "User", 10),
    def(&[("WCKeys", 2)], "WCKeys", 20),
];

struct Field {
    def: &'static FieldDef,
    /// Negative: left-justified.
    width: i32,
}

/// One `format=` item: an abbreviation, optionally `%WIDTH` (C's atoi; 0 keeps the default).
fn field(item: &str, tree: bool) -> anyhow::Result<Field> {
    let (name, width) = match item.split_once('%') {
        Some((name, width)) => (name, crate::slurm::fields::atoi(width)),
        None => (item, 0),
    };
    let def = FIELDS
        .iter()
        .find(|d| d.spellings.iter().any(|&(spelling, min)| abbreviates(name, spelling, min)))
        .ok_or_else(|| anyhow::anyhow!("Unknown field '{name}'"))?;
    let default = if tree && def.name == "Account" { -20 } else { def.width };
    Ok(Field { def, width: if width == 0 { default } else { width } })
}

impl crate::slurm::fields::Column for Field {
    fn header(&self) -> &str {
        self.def.name
    }
    fn width(&self) -> i32 {
        self.width
    }
}

/// sacct's layouts: `-p` (`Some(true)`: a trailing `|`), `-P` (`Some(false)`), else columns.
fn layout(parsable: Option<bool>) -> crate::slurm::fields::Layout {
    match parsable {
        Some(trailing) => crate::slurm::fields::Layout::Parsable { delimiter: "|".into(), trailing },
        None => crate::slurm::fields::Layout::Columns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(name: &str, parent: Option<&str>, depth: u32, shares: u32, users: &[&str]) -> AccountRow {
        AccountRow {
            name: name.into(),
            parent: parent.map(str::to_string),
            depth,
            shares,
            users: users.iter().map(|u| u.to_string()).collect(),
            description: String::new(),
            qos: "normal".into(),
            default_qos: String::new(),
        }
    }

    /// A lab: `physics` for ada and bob (granted QOS high, which `vision` inherits), `vision` under it for ada only,
    /// `shared` open to everyone.
    fn lab() -> Snapshot {
        let mut levels = BTreeMap::new();
        levels.insert("root".to_string(), AdminLevel::Administrator);
        levels.insert("ops".to_string(), AdminLevel::Operator);
        Snapshot {
            cluster: "drover".into(),
            accounts: vec![
                account("root", None, 0, 1, &[]),
                AccountRow { qos: "high,normal".into(), ..account("physics", Some("root"), 1, 3, &["ada", "bob"]) },
                AccountRow { qos: "high,normal".into(), ..account("vision", Some("physics"), 2, 1, &["ada"]) },
                account("shared", Some("root"), 1, 1, &[]),
            ],
            defined: true,
            levels,
            caller: "ada".into(),
        }
    }

    fn show(snapshot: &Snapshot, line: &str) -> String {
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let Command::Show(query) = parse(&args).unwrap() else { panic!("not a show command") };
        // carol exists on this host but Drover has never heard of her.
        snapshot.render(&query, &|name| name == "carol").unwrap().0
    }

    fn err(line: &str) -> String {
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        parse(&args).unwrap_err().to_string()
    }

    #[test]
    fn snakemake_checks_a_users_accounts_with_a_wide_one_column_listing() {
        // snakemake-executor-plugin-slurm 2.x: `sacctmgr -n -s list user "$USER" format=account%256`.
        let out = show(&lab(), "-n -s list user ada format=account%256");
        let accounts: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(accounts, ["root", "physics", "vision", "shared"], "every account admitting ada, in tree order");
        assert!(out.lines().all(|l| l.len() == 257), "right-justified to 256 and a space: {out:?}");
        // bob is not in vision's list; carol, unknown to Drover but a user of this host, may use open accounts.
        assert_eq!(show(&lab(), "-nP -s list user bob format=account"), "root\nphysics\nshared\n");
        assert_eq!(show(&lab(), "-nP -s list user carol format=account"), "root\nshared\n");
        assert_eq!(show(&lab(), "-nP -s list user nobody-here format=account"), "", "no such user: no rows");
    }

    #[test]
    fn users_show_their_default_account_and_admin_level_as_slurm_prints_them() {
        let out = show(&lab(), "show user");
        assert_eq!(
            out,
            "      User   Def Acct     Admin \n\
             ---------- ---------- --------- \n\
             \x20      ada    physics      None \n\
             \x20      bob    physics      None \n\
             \x20      ops       root  Operator \n\
             \x20     root       root Administ+ \n"
        );
        assert_eq!(show(&lab(), "-p show users where name=carol"), "User|Def Acct|Admin|\ncarol|root|None|\n");
        assert_eq!(show(&lab(), "-P -n list user defaultaccount=physics format=user"), "ada\nbob\n");
    }

    #[test]
    fn associations_list_each_account_then_its_users_with_shares_and_qos() {
        let out = show(&lab(), "-P show assoc format=cluster,account,user,share,parentname,qos");
        assert_eq!(
            out,
            "Cluster|Account|User|Share|ParentName|QOS\n\
             drover|root||1||normal\n\
             drover|root|ada|parent||normal\n\
             drover|root|bob|parent||normal\n\
             drover|root|ops|parent||normal\n\
             drover|root|root|parent||normal\n\
             drover|physics||3|root|high,normal\n\
             drover|physics|ada|parent||high,normal\n\
             drover|physics|bob|parent||high,normal\n\
             drover|vision||1|physics|high,normal\n\
             drover|vision|ada|parent||high,normal\n\
             drover|shared||1|root|normal\n\
             drover|shared|ada|parent||normal\n\
             drover|shared|bob|parent||normal\n\
             drover|shared|ops|parent||normal\n\
             drover|shared|root|parent||normal\n"
        );
        assert_eq!(
            show(&lab(), "-nP show assoc users=ada onlydefaults format=acc,u"),
            "physics|ada\n",
            "ada's jobs without --account charge physics"
        );
        assert_eq!(show(&lab(), "-nP show assoc tree accounts=vision format=acc,user"), "  vision|\n   vision|ada\n");
        assert_eq!(show(&lab(), "-nP show assoc clusters=elsewhere format=acc"), "");
    }

    #[test]
    fn accounts_show_description_and_organization_and_with_s_their_associations() {
        let mut lab = lab();
        lab.accounts[1].description = "Physics department".into();
        let out = show(&lab, "-P list accounts");
        assert_eq!(
            out,
            "Account|Descr|Org\n\
             physics|Physics department|physics\n\
             root|default root account|root\n\
             shared|shared|shared\n\
             vision|vision|physics\n"
        );
        assert_eq!(
            show(&lab, "-nP -s list account vision format=account,parentn,user,share"),
            "vision|physics||1\nvision||ada|parent\n"
        );
    }

    #[test]
    fn without_a_defined_tree_everyone_may_use_every_account_and_defaults_to_root() {
        let open = Snapshot {
            cluster: "drover".into(),
            accounts: vec![account("root", None, 0, 1, &[]), account("team", Some("root"), 1, 1, &[])],
            defined: false,
            levels: BTreeMap::new(),
            caller: "ada".into(),
        };
        assert_eq!(show(&open, "-nP -s list user ada format=user,defaulta,account"), "ada|root|root\nada|root|team\n");
    }

    #[test]
    fn a_listing_of_every_user_with_every_open_account_is_cut_and_says_so() {
        let mut big = lab();
        big.accounts = (0..400).map(|i| account(&format!("a{i:03}"), Some("root"), 1, 1, &[])).collect();
        big.accounts[0].users = (0..400).map(|i| format!("u{i:03}")).collect();
        let args: Vec<String> = ["-nP", "show", "assoc", "format=acc"].iter().map(|a| a.to_string()).collect();
        let Command::Show(query) = parse(&args).unwrap() else { panic!("not a show command") };
        let (out, cut) = big.render(&query, &|_| false).unwrap();
        assert!(cut);
        assert_eq!(out.lines().count(), MAX_ROWS);
    }

    #[test]
    fn fields_follow_sacctmgrs_abbreviations_and_widths() {
        let names = |spec: &str| -> Vec<(&str, i32)> {
            list(spec).iter().map(|f| field(f, false).map(|f| (f.def.name, f.width)).unwrap()).collect()
        };
        assert_eq!(
            names("U,DefaultA,Ad,Cl,Acc,Part,MaxJ,MaxN,MaxS,MaxW,GrpTRESMins,MaxTRESPerN,Des,O,ParentN,fairshare%-4"),
            [
                ("User", 10),
                ("Def Acct", 10),
                ("Admin", 9),
                ("Cluster", 10),
                ("Account", 10),
                ("Partition", 10),
                ("MaxJobs", 7),
                ("MaxNodes", 8),
                ("MaxSubmit", 9),
                ("MaxWall", 11),
                ("GrpTRESMins", 13),
                ("MaxTRESPerNode", 14),
                ("Descr", 20),
                ("Org", 20),
                ("ParentName", 10),
                ("Share", -4),
            ]
        );
        assert_eq!(field("a", false).err().unwrap().to_string(), "Unknown field 'a'", "too short for Account");
        assert_eq!(field("Accountx", false).err().unwrap().to_string(), "Unknown field 'Accountx'");
    }

    #[test]
    fn it_only_reads_and_says_where_changes_go() {
        assert!(err("add account physics").contains("drover account"));
        assert!(err("-i modify user ada set adminlevel=admin").contains("only reads"));
        assert!(err("show qos").contains("drover qos list"));
        assert_eq!(err("show user where nme=ada"), "Unknown condition: nme=ada");
        assert!(err("show user names+=ada").starts_with("Invalid operator '+='"));
        assert!(err("").starts_with("no command given"));
        assert!(matches!(parse(&["-V".to_string()]).unwrap(), Command::Version));
    }
}
