//! Lists of small ids as Slurm and the kernel write them: `0-3,5,7-15:2` (array indices, GPU indices, CPU lists).

/// What is wrong with a list of ids; the text names the entry and says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("{entry:?} is not a {item} or range; expected N, N-M or N-M:STEP")]
    NotAnId { entry: String, item: &'static str },
    #[error("{item} {shown} is not below {max_name} {max}")]
    TooLarge { item: &'static str, shown: String, max_name: &'static str, max: u32 },
    #[error("an entry is empty (a doubled, leading or trailing comma?)")]
    EmptyEntry,
    #[error("{entry:?} has a step but no range; expected N, N-M or N-M:STEP")]
    StepWithoutRange { entry: String },
    #[error("{entry:?} has a bad step {step:?}; expected N, N-M or N-M:STEP")]
    BadStep { entry: String, step: String },
    #[error("step 0 in {entry:?} must be at least 1")]
    ZeroStep { entry: String },
    #[error("range end {end} is below its start {start}")]
    Backwards { start: u32, end: u32 },
}

/// Parses comma-separated `N`, `N-M`, `N-M:STEP` entries into sorted, unique ids, each below `max` (named
/// `max_name` in the error); `item` names one id in errors ("task id").
pub fn parse_ranges(body: &str, item: &'static str, max: u32, max_name: &'static str) -> Result<Vec<u32>, RangeError> {
    let id = |text: &str, entry: &str| -> Result<u32, RangeError> {
        if !is_digits(text) {
            return Err(RangeError::NotAnId { entry: entry.to_string(), item });
        }
        match text.parse::<u64>() {
            Ok(n) if n < u64::from(max) => Ok(n as u32),
            _ => {
                let shown = text.trim_start_matches('0');
                let shown = if shown.is_empty() { "0" } else { shown }.to_string();
                Err(RangeError::TooLarge { item, shown, max_name, max })
            }
        }
    };
    let mut ids: Vec<u32> = Vec::new();
    // Duplicates are squeezed out whenever the list outgrows what unique ids could fill, so overlapping entries
    // cannot make it grow without bound.
    let squeeze_at = (max as usize).saturating_mul(2).max(1024);
    for entry in body.split(',') {
        if entry.is_empty() {
            return Err(RangeError::EmptyEntry);
        }
        let (range, step) = match entry.split_once(':') {
            Some((range, step)) => (range, Some(step)),
            None => (entry, None),
        };
        let (start, end) = match range.split_once('-') {
            Some((lo, hi)) => (id(lo, entry)?, id(hi, entry)?),
            None if step.is_some() => return Err(RangeError::StepWithoutRange { entry: entry.to_string() }),
            None => (id(range, entry)?, id(range, entry)?),
        };
        let step = match step {
            None => 1,
            Some(s) if !is_digits(s) => {
                return Err(RangeError::BadStep { entry: entry.to_string(), step: s.to_string() });
            }
            Some(s) => match s.parse::<u32>() {
                Ok(0) => return Err(RangeError::ZeroStep { entry: entry.to_string() }),
                Ok(n) => n,
                Err(_) => u32::MAX,
            },
        };
        if end < start {
            return Err(RangeError::Backwards { start, end });
        }
        ids.extend((start..=end).step_by(step as usize));
        if ids.len() > squeeze_at {
            ids.sort_unstable();
            ids.dedup();
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The compact form of sorted, unique ids: `0-3,5,7-8` (empty for none), consecutive ids as one range.
pub fn format_ranges(sorted: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { sorted[i].to_string() } else { format!("{}-{}", sorted[i], sorted[j]) });
        i = j + 1;
    }
    parts.join(",")
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_lists_and_steps_parse_sorted_and_unique() {
        assert_eq!(parse_ranges("0-3,5,7-11:2,2", "task id", 100, "MaxArraySize"), Ok(vec![0, 1, 2, 3, 5, 7, 9, 11]));
        assert!(
            parse_ranges("5-2", "task id", 100, "MaxArraySize").unwrap_err().to_string().contains("below its start")
        );
        assert!(parse_ranges("1,,2", "task id", 100, "MaxArraySize").unwrap_err().to_string().contains("empty"));
        let err = parse_ranges("100", "task id", 100, "MaxArraySize").unwrap_err();
        assert_eq!(err.to_string(), "task id 100 is not below MaxArraySize 100");
    }

    #[test]
    fn formatting_joins_consecutive_ids_and_round_trips() {
        assert_eq!(format_ranges(&[]), "");
        assert_eq!(format_ranges(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7-8");
        let ids = vec![1, 2, 4, 9, 10, 11];
        assert_eq!(parse_ranges(&format_ranges(&ids), "id", 100, "max"), Ok(ids));
    }
}
