//! `drover account add|modify|delete|list` and `drover qos add|modify|delete|list`: the replicated fair-share
//! tree and QOS (what `sacctmgr` does for Slurm). Changes are committed through the log; root only.

use clap::{Args, Subcommand};
use drover_state::slurm_time::{format_time_limit, parse_time_limit};
use drover_state::{AccountUpdate, AdminOp, Qos};

#[derive(Subcommand, Debug)]
pub enum AccountCmd {
    /// Add an account under PARENT (default root) with SHARES (default 1).
    Add {
        name: String,
        #[arg(long)]
        parent: Option<String>,
        /// Raw shares relative to the siblings (sacctmgr's Fairshare=).
        #[arg(long = "fairshare", alias = "shares")]
        shares: Option<u32>,
        /// Users allowed to charge it (comma-separated); none listed = anyone.
        #[arg(long, value_delimiter = ',')]
        users: Vec<String>,
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        qos: AccountQos,
    },
    /// Change an account's parent, shares, users or description.
    Modify {
        name: String,
        #[arg(long)]
        parent: Option<String>,
        #[arg(long = "fairshare", alias = "shares")]
        shares: Option<u32>,
        #[arg(long = "add-users", value_delimiter = ',')]
        add_users: Vec<String>,
        #[arg(long = "remove-users", value_delimiter = ',')]
        remove_users: Vec<String>,
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        qos: AccountQos,
    },
    /// Delete an account (it must have no child accounts and no active jobs).
    Delete { name: String },
    /// The account tree.
    List,
}

/// Which QOS an account's jobs may use (Slurm's association `QOS=` and `DefaultQOS=`).
#[derive(Args, Debug, Default)]
pub struct AccountQos {
    /// QOS its jobs (and those of accounts below it that set none) may use, comma-separated; "" clears the list (the
    /// account then allows what its parent does; `normal` alone where no account up to root lists any).
    #[arg(long)]
    qos: Option<String>,
    /// The QOS of its jobs that name none (one it allows); "" clears it.
    #[arg(long = "default-qos")]
    default_qos: Option<String>,
}

impl AccountQos {
    fn list(&self) -> Option<Vec<String>> {
        let list = self.qos.as_deref()?;
        Some(list.split(',').map(str::trim).filter(|q| !q.is_empty()).map(str::to_string).collect())
    }
}

#[derive(Args, Debug, Default)]
pub struct QosFields {
    #[arg(long)]
    priority: Option<u32>,
    /// Limits; `-1` removes one.
    #[arg(long = "max-jobs-per-user", allow_hyphen_values = true)]
    max_jobs_per_user: Option<i64>,
    #[arg(long = "max-gpus-per-user", allow_hyphen_values = true)]
    max_gpus_per_user: Option<i64>,
    #[arg(long = "max-jobs-per-account", allow_hyphen_values = true)]
    max_jobs_per_account: Option<i64>,
    #[arg(long = "max-gpus-per-account", allow_hyphen_values = true)]
    max_gpus_per_account: Option<i64>,
    /// The longest time limit (Slurm time format; UNLIMITED removes it).
    #[arg(long = "max-wall")]
    max_wall: Option<String>,
    /// QOS whose requeue-able jobs this one's may preempt (Slurm's Preempt=; PreemptMode=REQUEUE); "" clears.
    #[arg(long = "preempt")]
    preempt: Option<String>,
    /// Jobs of this QOS that started less than this long ago are not preempted (Slurm's PreemptExemptTime).
    #[arg(long = "preempt-exempt-time")]
    preempt_exempt_time: Option<String>,
    /// The progress timeout of this QOS's jobs that set none (`--progress-timeout`; Slurm time format, UNLIMITED
    /// removes it).
    #[arg(long = "progress-timeout")]
    progress_timeout: Option<String>,
    #[arg(long)]
    description: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum QosCmd {
    /// Add a QOS.
    Add {
        name: String,
        #[command(flatten)]
        fields: QosFields,
    },
    /// Change a QOS (only the fields given).
    Modify {
        name: String,
        #[command(flatten)]
        fields: QosFields,
    },
    Delete {
        name: String,
    },
    List,
}

fn limit(value: Option<i64>, current: Option<u32>, flag: &str) -> anyhow::Result<Option<u32>> {
    match value {
        None => Ok(current),
        Some(-1) => Ok(None),
        Some(v) => u32::try_from(v).map(Some).map_err(|_| anyhow::anyhow!("--{flag} must be -1 or 0..{}", u32::MAX)),
    }
}

fn apply_qos_fields(mut qos: Qos, f: &QosFields) -> anyhow::Result<Qos> {
    if let Some(p) = f.priority {
        qos.priority = p;
    }
    qos.max_jobs_per_user = limit(f.max_jobs_per_user, qos.max_jobs_per_user, "max-jobs-per-user")?;
    qos.max_gpus_per_user = limit(f.max_gpus_per_user, qos.max_gpus_per_user, "max-gpus-per-user")?;
    qos.max_jobs_per_account = limit(f.max_jobs_per_account, qos.max_jobs_per_account, "max-jobs-per-account")?;
    qos.max_gpus_per_account = limit(f.max_gpus_per_account, qos.max_gpus_per_account, "max-gpus-per-account")?;
    if let Some(w) = &f.max_wall {
        qos.max_wall_s = parse_time_limit(w).map_err(|e| anyhow::anyhow!("--max-wall {w:?}: {e}"))?;
    }
    if let Some(d) = &f.description {
        qos.description = d.clone();
    }
    if let Some(list) = &f.preempt {
        qos.preempt = list.split(',').map(str::trim).filter(|q| !q.is_empty()).map(str::to_string).collect();
    }
    if let Some(t) = &f.preempt_exempt_time {
        qos.preempt_exempt_time_s =
            parse_time_limit(t).map_err(|e| anyhow::anyhow!("--preempt-exempt-time {t:?}: {e}"))?;
    }
    if let Some(t) = &f.progress_timeout {
        qos.progress_timeout_s =
            parse_time_limit(t).map_err(|e| anyhow::anyhow!("--progress-timeout {t:?}: {e}"))?.filter(|s| *s > 0);
    }
    Ok(qos)
}

async fn admin(client: &drover_client::Client, op: AdminOp) -> anyhow::Result<()> {
    Ok(client.admin(&op).await?)
}

pub async fn account(client: &drover_client::Client, command: AccountCmd) -> anyhow::Result<()> {
    match command {
        AccountCmd::Add { name, parent, shares, users, description, qos } => {
            let (list, default_qos) = (qos.list(), qos.default_qos);
            let update = AccountUpdate {
                name,
                parent,
                shares,
                description,
                add_users: users,
                qos: list,
                default_qos,
                ..Default::default()
            };
            admin(client, AdminOp::AddAccount(update)).await
        }
        AccountCmd::Modify { name, parent, shares, add_users, remove_users, description, qos } => {
            let (list, default_qos) = (qos.list(), qos.default_qos);
            let update =
                AccountUpdate { name, parent, shares, description, add_users, remove_users, qos: list, default_qos };
            admin(client, AdminOp::ModifyAccount(update)).await
        }
        AccountCmd::Delete { name } => admin(client, AdminOp::DeleteAccount(name)).await,
        AccountCmd::List => {
            let registry = client.registry(false).await?;
            println!("{:<24} {:<16} {:>9}  {:<24} {:<20} Descr", "Account", "Parent", "Fairshare", "Users", "QOS");
            for row in &registry.shares {
                let Some(a) = registry.accounts.iter().find(|a| a.name == row.account) else { continue };
                let users = if a.users.is_empty() { "(any)".to_string() } else { a.users.join(",") };
                let mut qos = if a.qos.is_empty() { "(inherited)".to_string() } else { a.qos.join(",") };
                if !a.default_qos.is_empty() {
                    qos = format!("{qos} default={}", a.default_qos);
                }
                println!(
                    "{:<24} {:<16} {:>9}  {:<24} {:<20} {}",
                    format!("{}{}", " ".repeat(row.depth as usize), a.name),
                    a.parent.clone().unwrap_or_default(),
                    a.shares,
                    users,
                    qos,
                    a.description
                );
            }
            if registry.accounts.is_empty() {
                println!("(no accounts defined: every job charges an implicit account under root)");
            }
            Ok(())
        }
    }
}

fn opt(v: Option<u32>) -> String {
    v.map_or(String::new(), |n| n.to_string())
}

pub async fn qos(client: &drover_client::Client, command: QosCmd) -> anyhow::Result<()> {
    match command {
        QosCmd::Add { name, fields } => {
            let qos = apply_qos_fields(Qos { name, ..Qos::default() }, &fields)?;
            admin(client, AdminOp::PutQos { qos, create: true }).await
        }
        QosCmd::Modify { name, fields } => {
            let registry = client.registry(false).await?;
            let current = registry.qos.iter().find(|q| q.name == name).cloned();
            let Some(current) = current else { anyhow::bail!("Invalid qos specification: {name}: no such QOS") };
            let qos = apply_qos_fields(current, &fields)?;
            admin(client, AdminOp::PutQos { qos, create: false }).await
        }
        QosCmd::Delete { name } => admin(client, AdminOp::DeleteQos(name)).await,
        QosCmd::List => {
            let registry = client.registry(false).await?;
            let all = &registry.qos;
            println!(
                "{:<12} {:>8} {:>11} {:>11} {:>11} {:>11} {:>12}",
                "Name", "Priority", "MaxJobsPU", "MaxGPUsPU", "MaxJobsPA", "MaxGPUsPA", "MaxWall"
            );
            for q in all {
                println!(
                    "{:<12} {:>8} {:>11} {:>11} {:>11} {:>11} {:>12}",
                    q.name,
                    q.priority,
                    opt(q.max_jobs_per_user),
                    opt(q.max_gpus_per_user),
                    opt(q.max_jobs_per_account),
                    opt(q.max_gpus_per_account),
                    q.max_wall_s.map_or(String::new(), |w| format_time_limit(Some(w)))
                );
            }
            Ok(())
        }
    }
}
