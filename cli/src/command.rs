//! What every command shares before and after its own work: Drover's own leading flags, reading Slurm's
//! options with clap under the command's name, and turning the outcome into Slurm's output and exit status.

/// `--controllers=LIST` is Drover's own flag; accepted only before Slurm's options (leading), so it can never be
/// mistaken for a script argument.
pub fn take_controllers_flag(args: &[String]) -> (Option<String>, Vec<String>) {
    let mut controllers = None;
    let mut rest = args;
    while let Some(v) = rest.first().and_then(|a| a.strip_prefix("--controllers=")) {
        controllers = Some(v.to_string());
        rest = &rest[1..];
    }
    (controllers, rest.to_vec())
}

/// Drover's own options, which every Slurm command takes beside Slurm's (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Default, Clone, PartialEq, Eq)]
pub struct Common {
    /// Controller addresses (`host:port,...`); default: `$DROVER_CONTROLLERS` or `/etc/drover/client.toml`.
    #[arg(long = "controllers")]
    pub controllers: Option<String>,
}

/// A command's options (without `argv[0]`) read by clap as the command `name`; clap's own text (a bad option,
/// the usage) is the error.
pub fn parse_args<A: clap::Parser>(name: &str, args: &[String]) -> anyhow::Result<A> {
    A::try_parse_from(std::iter::once(name.to_string()).chain(args.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))
}

/// An error printed as it is: Slurm prints some without the `NAME: error:` prefix (`sacct: fatal: ...`,
/// scancel's list of valid states).
#[derive(Debug)]
pub struct Bare(pub String);

impl std::fmt::Display for Bare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Bare {}

/// A command's exit status from its outcome: its own status, or 1 after printing the error as Slurm does
/// (`NAME: error: ...` with its causes, or a [`Bare`] error as it is).
pub fn finish(name: &str, outcome: anyhow::Result<i32>) -> i32 {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            match e.downcast_ref::<Bare>() {
                Some(bare) => eprintln!("{bare}"),
                None => eprintln!("{name}: error: {e:#}"),
            }
            1
        }
    }
}
