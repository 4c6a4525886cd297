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
        nums.sort_by_key(|(_, n)| *n);
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

/// Expands Slurm hostlist syntax: `gpu[01-03,07],login` → gpu01 gpu02 gpu03 gpu07 login.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    const MAX_HOSTS: usize = 1_000_000;
    let mut hosts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let bytes = list.as_bytes();
    let mut items = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    for item in items.into_iter().filter(|s| !s.is_empty()) {
        let Some(open) = item.find('[') else {
            hosts.push(item.to_string());
            continue;
        };
        let close = item.rfind(']').ok_or_else(|| format!("unbalanced brackets in hostlist {list:?}"))?;
        let (prefix, suffix) = (&item[..open], &item[close + 1..]);
        for range in item[open + 1..close].split(',') {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            let width = lo.len();
            let lo: u64 = lo.parse().map_err(|_| format!("bad range {range:?} in hostlist {list:?}"))?;
            let hi: u64 = hi.parse().map_err(|_| format!("bad range {range:?} in hostlist {list:?}"))?;
            if hi < lo || hosts.len() as u64 + (hi - lo) > MAX_HOSTS as u64 {
                return Err(format!("bad range {range:?} in hostlist {list:?}"));
            }
            for n in lo..=hi {
                hosts.push(format!("{prefix}{n:0width$}{suffix}"));
            }
        }
    }
    Ok(hosts)
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
}
