//! `sshare`: the fair-share tree with each account's shares, usage and fair-share factor, as the leader's
//! scheduler computes them now (running jobs' usage so far included, all of it decayed with the half-life).

use clap::Parser;

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
    /// `|`-separated output.
    #[arg(short = 'P', long = "parsable2")]
    parsable: bool,
    /// Accepted for compatibility: every account row is shown already.
    #[arg(short = 'a', long = "all")]
    all: bool,
    #[arg(long = "controllers")]
    controllers: Option<String>,
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn run(args: &[String]) -> i32 {
    match sshare(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sshare: error: {e:#}");
            1
        }
    }
}

fn sshare(args: &[String]) -> anyhow::Result<()> {
    let args = Args::try_parse_from(std::iter::once("sshare".to_string()).chain(args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    let client = crate::connect::client(args.controllers.as_deref())?;
    let registry = crate::connect::runtime().block_on(client.registry(false))?;
    print!("{}", table(&registry.shares, &args));
    Ok(())
}

fn table(rows: &[drover_proto::wire::ShareRow], args: &Args) -> String {
    // Slurm's columns and widths; NormUsage only with -l.
    let mut columns = vec![("Account", 20), ("User", 10), ("RawShares", 10), ("NormShares", 11), ("RawUsage", 11)];
    if args.long {
        columns.push(("NormUsage", 11));
    }
    columns.extend([("EffectvUsage", 13), ("FairShare", 10)]);
    let mut out = String::new();
    let line = |cells: &[String]| -> String {
        if args.parsable {
            return format!("{}\n", cells.join("|"));
        }
        let padded: Vec<String> = cells
            .iter()
            .zip(&columns)
            .enumerate()
            .map(|(i, (c, &(_, w)))| if i == 0 { format!("{c:<w$}") } else { format!("{c:>w$}") })
            .collect();
        format!("{}\n", padded.join(" "))
    };
    if !args.noheader {
        out.push_str(&line(&columns.iter().map(|(h, _)| h.to_string()).collect::<Vec<_>>()));
        if !args.parsable {
            let dashes: Vec<String> = columns.iter().map(|&(_, w)| "-".repeat(w)).collect();
            out.push_str(&format!("{}\n", dashes.join(" ")));
        }
    }
    for r in rows.iter().filter(|r| args.accounts.is_empty() || args.accounts.contains(&r.account)) {
        let root = r.parent.is_none();
        let mut cells = vec![
            format!("{}{}", " ".repeat(r.depth as usize), r.account),
            String::new(),
            if root { String::new() } else { r.raw_shares.to_string() },
            format!("{:.6}", r.norm_shares),
            format!("{:.0}", r.raw_usage),
        ];
        if args.long {
            cells.push(format!("{:.6}", r.norm_usage));
        }
        cells.push(format!("{:.6}", r.effective_usage));
        cells.push(if root { String::new() } else { format!("{:.6}", r.fairshare) });
        out.push_str(&line(&cells));
    }
    out
}
