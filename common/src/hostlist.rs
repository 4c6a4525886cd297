//! Slurm's hostlist syntax (`gpu[01-04,07]`), both ways.

/// Compresses host names into Slurm's hostlist syntax: `gpu01,gpu02,gpu03,gpu07` → `gpu[01-03,07]`.
/// Names are grouped by their non-numeric prefix; zero padding is kept.
pub fn compress_hostlist(hosts: &[String]) -> String {
    use std::collections::BTreeMap;
    if hosts.is_empty() {
        return String::new();
    }
    // prefix -> (width, number) pairs; names without a numeric suffix stand alone.
    let mut groups: BTreeMap<String, Vec<(usize, u64)>> = BTreeMap::new();
    let mut plain = Vec::new();
    for host in hosts {
        let digits = host.chars().rev().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 18 {
            plain.push(host.clone());
            continue;
        }
        let (prefix, num) = host.split_at(host.len() - digits);
        groups.entry(prefix.to_string()).or_default().push((digits, num.parse().expect("digits")));
    }
    let mut parts = plain;
    for (prefix, mut nums) in groups {
        // By number, then width: equal names end up side by side, so `dedup` removes every repeat.
        nums.sort_unstable_by_key(|&(width, n)| (n, width));
        nums.dedup();
        let mut ranges: Vec<String> = Vec::new();
        let mut i = 0;
        while i < nums.len() {
            let (width, start) = nums[i];
            let mut j = i;
            while j + 1 < nums.len() && nums[j + 1].1 == nums[j].1 + 1 && nums[j + 1].0 == width {
                j += 1;
            }
            let end = nums[j].1;
            ranges.push(if j > i { format!("{start:0width$}-{end:0width$}") } else { format!("{start:0width$}") });
            i = j + 1;
        }
        if ranges.len() == 1 && !ranges[0].contains('-') {
            parts.push(format!("{prefix}{}", ranges[0]));
        } else {
            parts.push(format!("{prefix}[{}]", ranges.join(",")));
        }
    }
    parts.join(",")
}

/// The most host names one hostlist may expand to (a typo like `gpu[1-999999999]` must not exhaust memory).
pub const MAX_HOSTS: usize = 1_000_000;

/// The most bytes of host names one hostlist may expand to. [`MAX_HOSTS`] alone does not bound memory: a long
/// prefix over a wide range (`{a 1 MB prefix}[0-999998]`) would ask for a terabyte.
pub const MAX_EXPANDED_BYTES: usize = 64 * 1024 * 1024;

/// Why a hostlist could not be expanded; each names the list (and the range) so the user can find the typo.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("unbalanced brackets in hostlist {list:?}")]
    Unbalanced { list: String },
    #[error("nested brackets in hostlist {list:?}")]
    Nested { list: String },
    #[error("hostlist {list:?}: only one bracket group per name is supported")]
    SeveralGroups { list: String },
    #[error("bad range {range:?} in hostlist {list:?}")]
    BadRange { range: String, list: String },
    #[error("hostlist {list:?} expands to more than {} MiB of host names", MAX_EXPANDED_BYTES >> 20)]
    TooLarge { list: String },
}

/// Expands Slurm hostlist syntax: `gpu[01-03,07],login` → gpu01 gpu02 gpu03 gpu07 login.
///
/// Each comma-separated item is a plain name or `prefix[ranges]suffix` with one bracket group; anything else
/// (unbalanced or nested brackets, empty or reversed ranges, non-digits) is an error naming the problem. It never
/// panics, whatever the input: it runs inside `apply` and in the request checks before it.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let mut hosts = Vec::new();
    // Bytes of names so far; plain names count too, but they are no longer than the list itself.
    let mut bytes = 0usize;
    for item in split_top_level(list)?.into_iter().filter(|s| !s.is_empty()) {
        let Some(open) = item.find('[') else {
            if item.contains(']') {
                return Err(HostlistError::Unbalanced { list: list.to_string() });
            }
            bytes += item.len();
            hosts.push(item.to_string());
            continue;
        };
        let close =
            open + item[open..].find(']').ok_or_else(|| HostlistError::Unbalanced { list: list.to_string() })?;
        let (prefix, body, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
        if prefix.contains(']') || suffix.contains(['[', ']']) || body.contains('[') {
            return Err(HostlistError::SeveralGroups { list: list.to_string() });
        }
        for range in body.split(',') {
            let bad = || HostlistError::BadRange { range: range.to_string(), list: list.to_string() };
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let digits = |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
            if !digits(lo) || !digits(hi) {
                return Err(bad());
            }
            let width = lo.len();
            let (lo, hi): (u64, u64) = (lo.parse().map_err(|_| bad())?, hi.parse().map_err(|_| bad())?);
            if hi < lo || hosts.len() as u64 + (hi - lo) >= MAX_HOSTS as u64 {
                return Err(bad());
            }
            // Each name is the prefix, at most 18 digits (or `width`, also at most 18) and the suffix.
            let name_len = (prefix.len() + suffix.len()).saturating_add(18) as u64;
            let needed = (hi - lo + 1).saturating_mul(name_len);
            if needed.saturating_add(bytes as u64) > MAX_EXPANDED_BYTES as u64 {
                return Err(HostlistError::TooLarge { list: list.to_string() });
            }
            bytes += needed as usize;
            for n in lo..=hi {
                hosts.push(format!("{prefix}{n:0width$}{suffix}"));
            }
        }
    }
    Ok(hosts)
}

/// Splits at commas outside brackets; brackets must balance and never nest.
fn split_top_level(list: &str) -> Result<Vec<&str>, HostlistError> {
    let mut items = Vec::new();
    let mut inside = false;
    let mut start = 0;
    for (i, b) in list.bytes().enumerate() {
        match b {
            b'[' if inside => return Err(HostlistError::Nested { list: list.to_string() }),
            b'[' => inside = true,
            b']' if !inside => return Err(HostlistError::Unbalanced { list: list.to_string() }),
            b']' => inside = false,
            b',' if !inside => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if inside {
        return Err(HostlistError::Unbalanced { list: list.to_string() });
    }
    items.push(&list[start..]);
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_compress_like_slurm() {
        let hosts: Vec<String> = ["gpu01", "gpu02", "gpu03", "gpu07", "gpu04"].iter().map(|s| s.to_string()).collect();
        assert_eq!(compress_hostlist(&hosts), "gpu[01-04,07]");
        assert_eq!(compress_hostlist(&["node5".to_string()]), "node5");
        assert_eq!(compress_hostlist(&["login".to_string(), "a1".to_string(), "a2".to_string()]), "login,a[1-2]");
    }

    #[test]
    fn hostlists_expand_and_compress_back() {
        let hosts = expand_hostlist("gpu[01-03,07],login").unwrap();
        assert_eq!(hosts, ["gpu01", "gpu02", "gpu03", "gpu07", "login"]);
        assert_eq!(compress_hostlist(&hosts), "login,gpu[01-03,07]");
        assert!(expand_hostlist("gpu[3-1]").is_err());
        assert!(expand_hostlist("gpu[1-2").is_err());
    }

    /// `scontrol update partitionname=X nodes=][` once crashed every replica: the parser sliced `item[2..0]`.
    #[test]
    fn malformed_brackets_are_errors_not_panics() {
        for bad in
            ["][", "a]b[", "[", "]", "a[1-2]]", "a[[1-2]", "a[1-2][3]", "a[]", "a[-]", "a[1-]", "[1-2", "a[1,,2]"]
        {
            assert!(expand_hostlist(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// A long prefix over a wide range: within `MAX_HOSTS`, but a gigabyte of names (a terabyte with a 1 MB
    /// prefix), allocated inside `apply`. Refused before anything is allocated.
    #[test]
    fn long_prefix_over_wide_range_is_refused_by_size() {
        let list = format!("{}[0-999998]", "x".repeat(1000));
        let err = expand_hostlist(&list).unwrap_err();
        assert!(matches!(err, HostlistError::TooLarge { .. }), "{err}");
        assert!(err.to_string().ends_with("expands to more than 64 MiB of host names"), "{err}");
        // The budget is for the whole list, not per item.
        let list = vec![format!("{}[0-99999]", "x".repeat(100)); 10].join(",");
        assert!(expand_hostlist(&list).is_err());
        // A realistic cluster is far below it.
        assert_eq!(expand_hostlist("gpu-node-[000000-099999]").unwrap().len(), 100_000);
    }

    /// `a01,a1,a01` once compressed to `a[01,1,01]`: repeats of a name were only dropped when adjacent after
    /// sorting by number alone.
    #[test]
    fn compress_drops_every_repeat() {
        let hosts: Vec<String> = ["a01", "a1", "a01", "a1", "a02"].iter().map(|s| s.to_string()).collect();
        assert_eq!(compress_hostlist(&hosts), "a[1,01-02]");
        assert_eq!(expand_hostlist(&compress_hostlist(&hosts)).unwrap(), ["a1", "a01", "a02"]);
    }
}
