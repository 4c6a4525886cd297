//! What every command shares before and after its own work: Drover's own leading flags, reading Slurm's
//! options with clap under the command's name, and turning the outcome into Slurm's output and exit status.

use crate::sbatch_args::{OptionError, SbatchError};

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

/// A command's options (without `argv[0]`) read by clap as the command `name`. `--help` and `--version` print
/// and exit 0, as Slurm's do; an unknown option reads as Slurm's getopt says it; any other mistake is clap's text.
pub fn parse_args<A: clap::Parser>(name: &str, args: &[String]) -> anyhow::Result<A> {
    use clap::error::{ContextKind, ErrorKind};
    A::try_parse_from(std::iter::once(name.to_string()).chain(args.iter().cloned())).map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            std::process::exit(0)
        }
        ErrorKind::UnknownArgument => match e.get(ContextKind::InvalidArg) {
            Some(arg) => Bare(unrecognized_option(name, &arg.to_string())).into(),
            None => anyhow::anyhow!("{}", e.to_string().trim_end()),
        },
        _ => anyhow::anyhow!("{}", e.to_string().trim_end()),
    })
}

/// How a command's error reads: a [`Bare`] one as it is, else `NAME: error: ...`, with its causes when asked
/// (squeue and scontrol word their causes into their own messages).
pub fn error_text(name: &str, e: &anyhow::Error, with_causes: bool) -> String {
    match e.downcast_ref::<Bare>() {
        Some(bare) => bare.to_string(),
        None if with_causes => format!("{name}: error: {e:#}"),
        None => format!("{name}: error: {e}"),
    }
}

/// glibc getopt's words for an option nobody knows, and Slurm's hint after them.
pub fn unrecognized_option(name: &str, flag: &str) -> String {
    let what = match flag.strip_prefix('-') {
        Some(short) if !short.starts_with('-') => {
            format!("invalid option -- '{}'", short.chars().next().unwrap_or('?'))
        }
        _ => format!("unrecognized option '{}'", flag.split('=').next().unwrap_or(flag)),
    };
    format!("{name}: {what}\nTry \"{name} --help\" for more information")
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
            // sbatch's options as srun and salloc read them: Slurm's option processing exits 255.
            if let Some(SbatchError::CommandLine(option)) = e.downcast_ref::<SbatchError>() {
                match option {
                    OptionError::Unknown { flag } => eprintln!("{}", unrecognized_option(name, flag)),
                    other => eprintln!("{name}: error: {other}"),
                }
                return 255;
            }
            eprintln!("{}", error_text(name, &e, true));
            1
        }
    }
}
