//! Interface-name globs: `*` (any run) and `?` (one character); a comma separates patterns.

/// True when `name` matches any comma-separated pattern in `patterns`.
pub fn matches_any(patterns: &str, name: &str) -> bool {
    patterns
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| matches(p.as_bytes(), name.as_bytes()))
}

fn matches(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => matches(&p[1..], s) || (!s.is_empty() && matches(p, &s[1..])),
        (Some(b'?'), Some(_)) => matches(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => matches(&p[1..], &s[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::matches_any;

    #[test]
    fn globs() {
        assert!(matches_any("xv-*", "xv-client"));
        assert!(matches_any("eth0, xv-*", "eth0"));
        assert!(matches_any("veth??", "veth01"));
        assert!(!matches_any("veth??", "veth1"));
        assert!(!matches_any("xv-*", "eth0"));
        assert!(matches_any("*", "anything"));
        assert!(!matches_any("", "eth0"));
    }
}
