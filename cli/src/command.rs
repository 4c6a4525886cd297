//! What every command shares before it does its own work: Drover's own leading flags.

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
