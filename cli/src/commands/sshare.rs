//! `sshare`: the fair-share tree with each account's shares, usage and fair-share factor, as the leader's
//! scheduler computes them now (running jobs' usage so far included, all of it decayed with the half-life).
//!
//! Drover charges usage to accounts, not to user associations, so the rows are accounts; `-U` (and `-u`) list
//! the accounts each user may charge (an account naming its users, or one naming none) with the user in the
//! `User` column and the account's figures, which is what tools asking "which accounts are mine" read.

use crate::command::Common;
use clap::Parser;

use crate::slurm::fields::{FieldDef, Kind, Layout, def, header, parse_fields_in, row};
use Kind::{Number, Text};

/// Slurm 22.05's sshare columns that Drover has figures for.
const FIELDS: &[FieldDef] = &[
    def("Account", -20, Text),
    def("User", 10, Text),
    def("RawShares", 10, Number),
    def("NormShares", 11, Number),
    def("RawUsage", 11, Number),
    def("NormUsage", 11, Number),
    def("EffectvUsage", 13, Number),
    def("FairShare", 10, Number),
];
const DEFAULT_FIELDS: &str = "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare";
const LONG_FIELDS: &str = "Account,User,RawShares,NormShares,RawUsage,NormUsage,EffectvUsage,FairShare";

#[derive(Parser, Debug)]
#[command(name = "sshare", disable_help_flag = true, about = "Fair-share figures of a Drover cluster")]
struct Args {
    /// Only these accounts (and their subtrees are not expanded).
    #[arg(short = 'A', long = "accounts", value_delimiter = ',')]
    accounts: Vec<String>,
    /// Also NormUsage.
    #[arg(short = 'l', long = "long")]
    long: bool,
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// Fields (comma-separated names or prefixes, `%N` sets a width), as sacct's `-o`.
    #[arg(short = 'o', long = "format", alias = "fields")]
    format: Vec<String>,
    /// `|` after every field.
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    /// `|` between fields.
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    /// The accounts of these users (comma-separated names; `-U` alone: the caller's).
    #[arg(short = 'u', long = "users", value_delimiter = ',')]
    users: Vec<String>,
    /// Only user rows: the caller's accounts, unless `-u` names users.
    #[arg(short = 'U', long = "Users")]
    users_only: bool,
    /// Accepted for compatibility: every account row is shown already.
    #[arg(short = 'a', long = "all")]
    all: bool,
    #[command(flatten)]
    common: Common,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn run(args: &[String]) -> i32 {
    crate::command::finish("sshare", sshare(args).map(|()| 0))
}

fn sshare(args: &[String]) -> anyhow::Result<()> {
    let args: Args = crate::command::parse_args("sshare", args)?;
    let client = crate::connect::client(args.common.controllers.as_deref())?;
    let registry = crate::connect::runtime().block_on(client.registry(false))?;
    print!("{}", table(&registry, &args, &crate::identity::current_user().0)?);
    Ok(())
}

/// One printed row: an account's figures, for a user when the row is a user's.
struct ShareLine<'a> {
    share: &'a drover_proto::wire::ShareRow,
    user: Option<&'a str>,
}

fn table(registry: &drover_proto::wire::Registry, args: &Args, caller: &str) -> anyhow::Result<String> {
    let spec = match (args.format.is_empty(), args.long) {
        (false, _) => args.format.join(","),
        (true, true) => LONG_FIELDS.to_string(),
        (true, false) => DEFAULT_FIELDS.to_string(),
    };
    let fields = parse_fields_in(&spec, FIELDS)?;
    let layout = match (args.parsable, args.parsable2) {
        (_, true) => Layout::Parsable { delimiter: "|".into(), trailing: false },
        (true, false) => Layout::Parsable { delimiter: "|".into(), trailing: true },
        _ => Layout::Columns,
    };
    let wanted = |account: &str| args.accounts.is_empty() || args.accounts.iter().any(|a| a == account);
    let shares = registry.shares.iter().filter(|r| wanted(&r.account));
    let lines: Vec<ShareLine> = if args.users_only || !args.users.is_empty() {
        let users: Vec<&str> =
            if args.users.is_empty() { vec![caller] } else { args.users.iter().map(String::as_str).collect() };
        let admits = |account: &str, user: &str| {
            registry
                .accounts
                .iter()
                .find(|a| a.name == account)
                .is_none_or(|a| a.users.is_empty() || a.users.iter().any(|u| u == user))
        };
        shares
            .flat_map(|share| {
                users.iter().filter(|u| admits(&share.account, u)).map(move |u| ShareLine { share, user: Some(u) })
            })
            .collect()
    } else {
        shares.map(|share| ShareLine { share, user: None }).collect()
    };
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&header(&fields, &layout));
    }
    for line in &lines {
        let values: Vec<String> = fields.iter().map(|f| value(f.name(), line)).collect();
        out.push_str(&row(&fields, &values, &layout));
    }
    Ok(out)
}

fn value(field: &str, line: &ShareLine) -> String {
    let r = line.share;
    let root = r.parent.is_none();
    match field {
        // Account rows are indented by depth, as Slurm's tree; user rows are not.
        "Account" if line.user.is_some() => r.account.clone(),
        "Account" => format!("{}{}", " ".repeat(r.depth as usize), r.account),
        "User" => line.user.unwrap_or_default().to_string(),
        "RawShares" if root => String::new(),
        "RawShares" => r.raw_shares.to_string(),
        "NormShares" => format!("{:.6}", r.norm_shares),
        "RawUsage" => format!("{:.0}", r.raw_usage),
        "NormUsage" => format!("{:.6}", r.norm_usage),
        "EffectvUsage" => format!("{:.6}", r.effective_usage),
        "FairShare" if root => String::new(),
        "FairShare" => format!("{:.6}", r.fairshare),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use drover_proto::wire::{Registry, ShareRow};

    use super::*;

    fn registry() -> Registry {
        let share = |account: &str, parent: Option<&str>, depth| ShareRow {
            account: account.into(),
            parent: parent.map(str::to_string),
            depth,
            raw_shares: 2,
            norm_shares: 0.5,
            raw_usage: 1234.4,
            norm_usage: 0.25,
            effective_usage: 0.25,
            fairshare: 0.75,
        };
        let account = |name: &str, users: &[&str]| drover_state::Account {
            name: name.into(),
            users: users.iter().map(|u| u.to_string()).collect(),
            ..drover_state::Account::default()
        };
        Registry {
            accounts: vec![account("root", &[]), account("physics", &["alice"]), account("bio", &["bob"])],
            qos: vec![],
            reservations: vec![],
            shares: vec![share("root", None, 0), share("physics", Some("root"), 1), share("bio", Some("root"), 1)],
            roles: vec![],
            now_ms: 0,
        }
    }

    fn run(args: &[&str]) -> String {
        let args = Args::try_parse_from(std::iter::once("sshare").chain(args.iter().copied())).unwrap();
        table(&registry(), &args, "alice").unwrap()
    }

    #[test]
    fn the_tree_prints_in_slurms_columns_and_parsable_layouts() {
        let out = run(&["-P"]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare");
        assert_eq!(lines[1], "root|||0.500000|1234|0.250000|");
        assert_eq!(lines[2], " physics||2|0.500000|1234|0.250000|0.750000");
        let columns = run(&["-l"]);
        assert!(columns.starts_with("Account              "), "{columns}");
        assert!(columns.lines().nth(1).unwrap().starts_with("-------------------- ----------"), "{columns}");
        assert_eq!(run(&["-n", "-p", "-A", "bio", "-o", "Account,Fair"]), " bio|0.750000|\n");
    }

    #[test]
    fn users_rows_list_the_accounts_each_user_may_charge() {
        // What snakemake's Slurm executor runs to find the caller's accounts.
        assert_eq!(
            run(&["-U", "--format", "Account%256", "--noheader"]).lines().map(str::trim).collect::<Vec<_>>(),
            ["root", "physics"]
        );
        let bob = run(&["-n", "-P", "-u", "bob,carol", "-o", "Account,User"]);
        assert_eq!(bob, "root|bob\nroot|carol\nbio|bob\n", "in tree order, each account with its users");
        let err = Args::try_parse_from(["sshare", "-o", "Bogus"]).map(|a| table(&registry(), &a, "x").map(|_| ()));
        assert_eq!(err.unwrap().unwrap_err().to_string(), "Invalid field requested: \"Bogus\"");
    }
}
