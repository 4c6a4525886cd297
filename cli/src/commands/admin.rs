//! `drover admin grant|revoke|list`, `drover audit`, `drover whoami` and `drover certs init|issue`: roles in the
//! replicated state (Slurm's AdminLevel), the audit log of administrative changes, the caller's verified
//! identity, and the keys and certificates a production cluster needs.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use drover_client::Client;
use drover_state::{AdminLevel, AdminOp, RoleGrant};

#[derive(Subcommand, Debug)]
pub enum AdminCmd {
    /// Grant USER (a name or a uid) an administrative level: operator (any job, drain and resume nodes) or admin
    /// (also partitions, reservations, accounts, QOS, roles, replicas). Administrators only.
    Grant { user: String, level: String },
    /// Take a user's administrative level away.
    Revoke { user: String },
    /// Operators and administrators.
    List,
}

#[derive(Subcommand, Debug)]
pub enum CertsCmd {
    /// Create a cluster CA and cluster key in DIR (keep ca.key off the cluster afterwards).
    Init {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "drover")]
        cluster_name: String,
    },
    /// Issue DIR/NAME.pem and DIR/NAME.key for a role: controller:ID, agent:NODE or client:HOST. Name the host's
    /// addresses and DNS names, which peers check against the address they dial.
    Issue {
        #[arg(long)]
        dir: PathBuf,
        /// controller:1, agent:gpu01, client:login1
        #[arg(long)]
        role: String,
        /// The file name (default: derived from the role).
        #[arg(long)]
        name: Option<String>,
        #[arg(long = "ip", value_delimiter = ',')]
        ips: Vec<IpAddr>,
        #[arg(long = "dns", value_delimiter = ',')]
        dns: Vec<String>,
    },
}

/// A user name or uid, as the passwd database knows it.
fn resolve_user(user: &str) -> anyhow::Result<(u32, String)> {
    let uid = crate::identity::user_uid(user).with_context(|| format!("no such user {user:?} (give a uid)"))?;
    let name = crate::identity::user_name(uid).unwrap_or_else(|| user.to_string());
    Ok((uid, name))
}

pub async fn admin(client: &Client, command: AdminCmd) -> anyhow::Result<()> {
    match command {
        AdminCmd::Grant { user, level } => {
            let level = AdminLevel::parse(&level)
                .with_context(|| format!("unknown level {level:?}: use operator, admin or none"))?;
            let (uid, user) = resolve_user(&user)?;
            client.admin(&AdminOp::SetRole(RoleGrant { uid, user: user.clone(), level })).await?;
            println!("{user} (uid {uid}) is now {}", level.name());
        }
        AdminCmd::Revoke { user } => {
            let (uid, user) = resolve_user(&user)?;
            client.admin(&AdminOp::SetRole(RoleGrant { uid, user: user.clone(), level: AdminLevel::None })).await?;
            println!("{user} (uid {uid}) has no administrative level now");
        }
        AdminCmd::List => {
            let registry = client.registry(false).await?;
            println!("{:<8} {:<20} ADMINLEVEL", "UID", "USER");
            println!("{:<8} {:<20} {}", 0, "root", AdminLevel::Administrator.name());
            for grant in registry.roles {
                println!("{:<8} {:<20} {}", grant.uid, grant.user, grant.level.name());
            }
        }
    }
    Ok(())
}

/// `drover audit [--from ID] [-n N]`: who changed what, and when.
pub async fn audit(client: &Client, from_id: u64, limit: u32, json: bool) -> anyhow::Result<()> {
    let entries = client.audit(from_id, limit).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    println!("{:>6} {:<20} {:>6} {:<20} DETAIL", "ID", "TIME", "UID", "ACTION");
    for e in entries {
        println!(
            "{:>6} {:<20} {:>6} {:<20} {}",
            e.id,
            crate::format::format_timestamp(Some(e.time_ms)),
            e.uid,
            e.action,
            e.detail
        );
    }
    Ok(())
}

/// `drover whoami`: the identity the controllers verified, and its level.
pub async fn whoami(client: &Client) -> anyhow::Result<()> {
    let me = client.who_am_i().await?;
    println!("uid={} gid={} user={} adminlevel={}", me.uid, me.gid, me.user, me.admin_level);
    Ok(())
}

pub fn certs(command: CertsCmd) -> anyhow::Result<()> {
    match command {
        CertsCmd::Init { dir, cluster_name } => {
            let pki = crate::pki::Pki::create(&dir, &cluster_name)?;
            println!("CA: {}\ncluster key: {}", pki.ca_path().display(), pki.cluster_key_path().display());
            println!("Move {} off the cluster once every certificate is issued.", dir.join("ca.key").display());
        }
        CertsCmd::Issue { dir, role, name, ips, dns } => {
            let role: drover_auth::Role = match role.split_once(':') {
                Some(("controller", id)) => drover_auth::Role::Controller(id.parse().context("controller:ID")?),
                Some(("agent", node)) if !node.is_empty() => drover_auth::Role::Agent(node.to_string()),
                Some(("client", host)) if !host.is_empty() => drover_auth::Role::Client(host.to_string()),
                _ => bail!("--role must be controller:ID, agent:NODE or client:HOST, not {role:?}"),
            };
            let name = name.unwrap_or_else(|| match &role {
                drover_auth::Role::Controller(id) => format!("controller-{id}"),
                drover_auth::Role::Agent(node) => format!("agent-{node}"),
                drover_auth::Role::Client(host) => format!("client-{host}"),
            });
            let pki = crate::pki::Pki::open(&dir)?;
            let (cert, key) = pki.issue(&name, &role, &dns, &ips)?;
            println!("{role}: {} and {}", cert.display(), key.display());
        }
    }
    Ok(())
}
