//! Lists of small ids as Slurm and the kernel write them: `0-3,5,7-15:2` (array indices, GPU indices, CPU lists).

/// Parses comma-separated `N`, `N-M`, `N-M:STEP` entries into sorted, unique ids, each below `max` (named
/// `max_name` in the error); `item` names one id in errors ("task id").
pub fn parse_ranges(body: &str, item: &str, max: u32, max_name: &str) -> Result<Vec<u32>, String> {
    const EXPECTED: &str = "expected N, N-M or N-M:STEP";
    let id = |text: &str, entry: &str| -> Result<u32, String> {
        if !is_digits(text) {
            return Err(format!("{entry:?} is not a {item} or range; {EXPECTED}"));
        }
        match text.parse::<u64>() {
            Ok(n) if n < u64::from(max) => Ok(n as u32),
            _ => {
                let shown = text.trim_start_matches('0');
                Err(format!("{item} {} is not below {max_name} {max}", if shown.is_empty() { "0" } else { shown }))
            }
        }
    };
    let mut ids: Vec<u32> = Vec::new();
    // Duplicates are squeezed out whenever the list outgrows what unique ids could fill, so overlapping entries
    // cannot make it grow without bound.
    let squeeze_at = (max as usize).saturating_mul(2).max(1024);
    for entry in body.split(',') {
        if entry.is_empty() {
            return Err("an entry is empty (a doubled, leading or trailing comma?)".to_string());
        }
        let (range, step) = match entry.split_once(':') {
            Some((range, step)) => (range, Some(step)),
            None => (entry, None),
        };
        let (start, end) = match range.split_once('-') {
            Some((lo, hi)) => (id(lo, entry)?, id(hi, entry)?),
            None if step.is_some() => {
                return Err(format!("{entry:?} has a step but no range; {EXPECTED}"));
            }
            None => (id(range, entry)?, id(range, entry)?),
        };
        let step = match step {
            None => 1,
            Some(s) if !is_digits(s) => return Err(format!("{entry:?} has a bad step {s:?}; {EXPECTED}")),
            Some(s) => match s.parse::<u32>() {
                Ok(0) => return Err(format!("step 0 in {entry:?} must be at least 1")),
                Ok(n) => n,
                Err(_) => u32::MAX,
            },
        };
        if end < start {
            return Err(format!("range end {end} is below its start {start}"));
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
        assert!(parse_ranges("5-2", "task id", 100, "MaxArraySize").unwrap_err().contains("below its start"));
        assert!(parse_ranges("1,,2", "task id", 100, "MaxArraySize").unwrap_err().contains("empty"));
        let err = parse_ranges("100", "task id", 100, "MaxArraySize").unwrap_err();
        assert_eq!(err, "task id 100 is not below MaxArraySize 100");
    }

    #[test]
    fn formatting_joins_consecutive_ids_and_round_trips() {
        assert_eq!(format_ranges(&[]), "");
        assert_eq!(format_ranges(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7-8");
        let ids = vec![1, 2, 4, 9, 10, 11];
        assert_eq!(parse_ranges(&format_ranges(&ids), "id", 100, "max"), Ok(ids));
    }
}
