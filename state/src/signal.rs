//! Signal names as Slurm's commands take them (`USR1`, `SIGUSR1`, `10`), and `--signal=[{R|B}:]SIG[@secs]`.

use crate::model::job::WarnSignal;

/// The warning lead time when `--signal` gives none (Slurm's default).
pub const DEFAULT_WARNING_S: u32 = 60;
/// The longest lead time accepted (Slurm's limit).
pub const MAX_WARNING_S: u32 = 65_535;

/// What is wrong with a signal or a `--signal` value, in Slurm's words where it has them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    #[error("Invalid signal: {0}")]
    Invalid(String),
    #[error("unknown --signal flag {0:?}: expected B or R before ':'")]
    UnknownFlag(char),
    #[error("--signal lead time {0:?} must be whole seconds, at most {MAX_WARNING_S}")]
    LeadTime(String),
}

/// A signal by number (1..=64) or name, with or without `SIG`, in any case.
pub fn parse_signal(text: &str) -> Result<i32, SignalError> {
    if let Ok(n) = text.parse::<i32>() {
        return if (1..=64).contains(&n) { Ok(n) } else { Err(SignalError::Invalid(text.to_string())) };
    }
    let upper = text.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    let n = match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "ABRT" => libc::SIGABRT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "URG" => libc::SIGURG,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        "WINCH" => libc::SIGWINCH,
        _ => return Err(SignalError::Invalid(text.to_string())),
    };
    Ok(n)
}

/// `--signal=[{R|B}:]SIG[@secs]`: `B:` signals only the batch shell, `R:` is accepted (reservation end).
pub fn parse_warn_signal(value: &str) -> Result<WarnSignal, SignalError> {
    let (flags, rest) = match value.split_once(':') {
        Some((flags, rest)) => (flags, rest),
        None => ("", value),
    };
    let mut warning = WarnSignal { signal: 0, before_s: DEFAULT_WARNING_S, batch_only: false, reservation: false };
    for flag in flags.chars() {
        match flag.to_ascii_uppercase() {
            'B' => warning.batch_only = true,
            'R' => warning.reservation = true,
            other => return Err(SignalError::UnknownFlag(other)),
        }
    }
    let (signal, secs) = match rest.split_once('@') {
        Some((signal, secs)) => (signal, Some(secs)),
        None => (rest, None),
    };
    warning.signal = parse_signal(signal)?;
    if let Some(secs) = secs {
        warning.before_s = secs
            .parse::<u32>()
            .ok()
            .filter(|s| *s <= MAX_WARNING_S)
            .ok_or_else(|| SignalError::LeadTime(secs.to_string()))?;
    }
    Ok(warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("USR1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("sigterm"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("9"), Ok(9));
        assert!(parse_signal("65").is_err() && parse_signal("FOO").is_err() && parse_signal("").is_err());
    }

    #[test]
    fn warning_signals_parse_as_slurm_writes_them() {
        let w = parse_warn_signal("USR1@90").unwrap();
        assert_eq!((w.signal, w.before_s, w.batch_only), (libc::SIGUSR1, 90, false));
        let w = parse_warn_signal("B:SIGUSR2").unwrap();
        assert_eq!((w.signal, w.before_s, w.batch_only), (libc::SIGUSR2, DEFAULT_WARNING_S, true));
        assert!(parse_warn_signal("RB:10@5").unwrap().reservation);
        for bad in ["X:USR1", "USR1@", "USR1@-1", "USR1@99999999", "@10", "NOPE@10"] {
            assert!(parse_warn_signal(bad).is_err(), "{bad}");
        }
    }
}
