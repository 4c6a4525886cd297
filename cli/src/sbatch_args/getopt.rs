//! Reading arguments as `getopt_long` does, for the command line, `#SBATCH` lines and `SBATCH_*` variables alike.

use super::options::{Arg, OptDef, Takes, env_options, find_long, find_short};
use super::options::{Item, SbatchOption};
use super::values::invalid;
use super::{OptionError, SbatchError};

pub(super) struct Parsed {
    pub items: Vec<Item>,
    pub positional: Option<usize>,
}

/// `getopt_long`-style parsing of `args`. Stops at the first positional argument (or after `--`) and reports its
/// index; the caller decides whether positionals are allowed.
pub(super) fn parse_args(args: &[String]) -> Result<Parsed, OptionError> {
    let mut items = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            let next = i + 1;
            return Ok(Parsed { items, positional: (next < args.len()).then_some(next) });
        }
        if let Some(body) = arg.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (body, None),
            };
            let flag = format!("--{name}");
            let def = find_long(name).ok_or_else(|| {
                match name.starts_with("container-") || name.starts_with("no-container-") {
                    true => OptionError::UnknownContainer { flag: flag.clone() },
                    false => OptionError::Unknown { flag: flag.clone() },
                }
            })?;
            let value = match (def.takes.arg(), inline) {
                (Arg::Required | Arg::Optional, Some(v)) => Some(v.to_string()),
                (Arg::Required, None) => {
                    i += 1;
                    Some(args.get(i).cloned().ok_or(OptionError::MissingValue { flag: flag.clone() })?)
                }
                (Arg::No, Some(v)) => return Err(OptionError::UnexpectedValue { flag, value: v.to_string() }),
                (Arg::No | Arg::Optional, None) => None,
            };
            items.push(parse_value(def, &flag, value)?);
            i += 1;
        } else if arg.len() > 1 && arg.starts_with('-') {
            let cluster = &arg[1..];
            for (at, c) in cluster.char_indices() {
                let flag = format!("-{c}");
                let def = find_short(c).ok_or_else(|| OptionError::Unknown { flag: flag.clone() })?;
                if def.takes.arg() == Arg::No {
                    items.push(parse_value(def, &flag, None)?);
                    continue;
                }
                let rest = &cluster[at + c.len_utf8()..];
                let value = match (rest.is_empty(), def.takes.arg()) {
                    (false, _) => Some(rest.to_string()),
                    // getopt: an optional value must be attached (`-Xvalue`).
                    (true, Arg::Optional) => None,
                    (true, _) => {
                        i += 1;
                        Some(args.get(i).cloned().ok_or(OptionError::MissingValue { flag: flag.clone() })?)
                    }
                };
                items.push(parse_value(def, &flag, value)?);
                break;
            }
            i += 1;
        } else {
            return Ok(Parsed { items, positional: Some(i) });
        }
    }
    Ok(Parsed { items, positional: None })
}

/// Checks and parses one option's value, as its entry in the option table says.
fn parse_value(def: &OptDef, flag: &str, value: Option<String>) -> Result<Item, OptionError> {
    match (def.takes, value) {
        (Takes::Refused(_, reason), _) => Err(OptionError::Refused { flag: flag.to_string(), reason }),
        (Takes::Ignored(_, note), value) => Ok(Item::Option(SbatchOption::Ignored { flag: def.long, value, note })),
        (Takes::Nothing(bare) | Takes::Optional(bare, _), None) => Ok(bare()),
        (Takes::Value(_) | Takes::Raw(_), None) => Err(OptionError::MissingValue { flag: flag.to_string() }),
        // The argument reader never gives a value to an option that takes none; refused all the same.
        (Takes::Nothing(_), Some(value)) => Err(OptionError::UnexpectedValue { flag: flag.to_string(), value }),
        (Takes::Value(_) | Takes::Optional(..), Some(value)) if value.is_empty() => {
            Err(invalid(flag, &value, "the value is empty"))
        }
        (Takes::Value(parse) | Takes::Optional(_, parse) | Takes::Raw(parse), Some(value)) => parse(flag, value),
    }
}

/// Whether an environment variable turns a value-less option on, as Slurm reads flag variables: empty, `yes`
/// (any case) or a non-zero whole number. Anything else leaves the option alone.
fn env_flag_on(value: &str) -> bool {
    if value.is_empty() || value.eq_ignore_ascii_case("yes") {
        return true;
    }
    let digits = value.strip_prefix(['-', '+']).unwrap_or(value);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && digits.bytes().any(|b| b != b'0')
}

/// The options the `SBATCH_*` input environment variables set, in [`env_options`] order.
pub(super) fn environment_options(env: &[(String, String)]) -> Result<Vec<SbatchOption>, SbatchError> {
    let mut options = Vec::new();
    for (var, long) in env_options() {
        // The first of duplicate names, as getenv finds it.
        let Some((_, value)) = env.iter().find(|(name, _)| name == var) else { continue };
        let def = find_long(long).expect("env_options names known options");
        let value = match def.takes.arg() {
            Arg::No if env_flag_on(value) => None,
            Arg::No => continue,
            Arg::Optional if value.is_empty() => None,
            // An empty value for an option that needs one says nothing: skipped rather than refused.
            Arg::Required if value.is_empty() => continue,
            Arg::Optional | Arg::Required => Some(value.clone()),
        };
        let at_var = |error| SbatchError::Environment { var: var.to_string(), error };
        match parse_value(def, &format!("--{long}"), value).map_err(at_var)? {
            Item::Option(option) => options.push(option),
            Item::Wrap(_) | Item::Info(_) => {
                unreachable!("no variable stands for --wrap, --version, --help or --usage")
            }
        }
    }
    Ok(options)
}
