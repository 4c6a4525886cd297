//! The batch script: the checks Slurm makes before reading it, and its `#SBATCH` directives.

use super::getopt::parse_args;
use super::options::{Item, SbatchOption};
use super::{MAX_SCRIPT_BYTES, OptionError, SbatchError};
use crate::slurm::time::is_c_space;

/// The script Slurm generates for `--wrap=CMD`.
pub fn wrap_script(command: &str) -> String {
    format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n")
}

/// Checks a script as Slurm does before it parses directives.
pub(super) fn check_script(script: &str) -> Result<(), SbatchError> {
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(SbatchError::ScriptTooLarge { size: script.len(), limit: MAX_SCRIPT_BYTES });
    }
    if script.is_empty() {
        return Err(SbatchError::EmptyScript);
    }
    if script.trim().is_empty() {
        return Err(SbatchError::WhitespaceScript);
    }
    if !script.starts_with("#!") {
        return Err(SbatchError::NotABatchScript);
    }
    if let Some(at) = script.find("\r\n") {
        let line = script[..at].matches('\n').count() + 1;
        return Err(SbatchError::DosLineBreaks { line });
    }
    Ok(())
}

/// C's `isspace` for a char (ASCII only, as in the C locale Slurm's directive reader runs in).
fn is_c_space_char(c: char) -> bool {
    c.is_ascii() && is_c_space(c as u8)
}

/// Splits a `#SBATCH` line's remainder into arguments as Slurm does: whitespace separates, single and double
/// quotes group (and are removed), a backslash escapes the next character, an unquoted `#` starts a comment.
pub(super) fn directive_words(text: &str) -> Result<Vec<String>, OptionError> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                word.push(next);
            }
            in_word = true;
            continue;
        }
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c == '#' => break,
            None if is_c_space_char(c) => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if let Some(quote) = quote {
        return Err(OptionError::UnmatchedQuote { quote });
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// The options in a script's directives, in order, and a warning if it used Slurm's old `#SLURM` prefix.
///
/// As in Slurm's `_opt_batch_script`, only lines starting exactly with `#SBATCH` (or `#SLURM`) are directives,
/// and they are read until the first command: a line with something other than C whitespace before its first
/// `#`, or no `#` at all but something that is not whitespace. Blank lines and comments do not stop the scan.
pub(super) fn script_directives(script: &str) -> Result<(Vec<SbatchOption>, Option<String>), SbatchError> {
    let mut options = Vec::new();
    let mut old_prefix = None;
    for (index, line) in script.split('\n').enumerate() {
        let rest = match (line.strip_prefix("#SBATCH"), line.strip_prefix("#SLURM")) {
            (Some(rest), _) => rest,
            (None, Some(rest)) => {
                old_prefix.get_or_insert_with(|| {
                    format!(
                        "script line {}: change #SLURM to #SBATCH in your script, and check the options are valid \
                         in sbatch",
                        index + 1
                    )
                });
                rest
            }
            (None, None) => {
                let first = line.bytes().find(|b| !is_c_space(*b));
                match first {
                    None | Some(b'#') => continue,
                    Some(_) => break,
                }
            }
        };
        let at_line = |error| SbatchError::Directive { line: index + 1, text: line.to_string(), error };
        let words = directive_words(rest).map_err(at_line)?;
        if let Some(word) =
            words.first().filter(|w| w.eq_ignore_ascii_case("hetjob") || w.eq_ignore_ascii_case("packjob"))
        {
            return Err(at_line(OptionError::HetJob { word: word.clone() }));
        }
        let parsed = parse_args(&words).map_err(at_line)?;
        if let Some(at) = parsed.positional {
            return Err(at_line(OptionError::UnexpectedArgument { arg: words[at].clone() }));
        }
        if words.iter().any(|w| w == "--") {
            return Err(at_line(OptionError::UnexpectedArgument { arg: "--".to_string() }));
        }
        for item in parsed.items {
            match item {
                Item::Option(option) => options.push(option),
                Item::Wrap(_) => return Err(at_line(OptionError::WrapInScript)),
                // Read from the command line only: a script cannot make sbatch print and submit nothing.
                Item::Info(_) => {}
            }
        }
    }
    Ok((options, old_prefix))
}
