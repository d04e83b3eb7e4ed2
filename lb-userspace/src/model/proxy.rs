//! Writer settings of kube-proxy's modes: what kube-proxy's flags and the host's
//! capabilities change in the rules, apart from the node ([`super::NodeSettings`]).
//! [`WriterOptions`] carries the settings every netfilter mode shares and each mode's own
//! ([`IptablesOptions`], [`IpvsOptions`]). Sources (kube-proxy's test configurations) set
//! them; the emitters (`crate::emit`) read them.

/// The writer settings of every mode: shared ones, then each mode's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriterOptions {
    /// The masquerade mark (iptables, ipvs and nftables).
    pub mark: MasqueradeMark,
    /// Host capabilities (iptables and ipvs).
    pub host: HostFeatures,
    pub iptables: IptablesOptions,
    pub ipvs: IpvsOptions,
}

/// The masquerade mark: its value and its text in rules.
///
/// kube-proxy prints `1 << masqueradeBit` with Go's `%#08x`, which zero-pads to eight hex
/// digits (`0x00004000`); its unit tests inject the literal `0x4000`, so the text is kept
/// as given when a mark is configured literally.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasqueradeMark {
    pub value: u32,
    pub text: String,
}

impl MasqueradeMark {
    /// The mark of `--iptables-masquerade-bit` (kube-proxy's default is 14).
    pub fn from_bit(bit: u8) -> Self {
        let value = 1u32 << u32::from(bit.min(31));
        Self {
            value,
            text: format!("{value:#010x}"),
        }
    }

    /// A mark written literally (`0x4000`), kept verbatim in the rules.
    pub fn literal(text: &str) -> Option<Self> {
        let t = text.trim();
        let value = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => t.parse().ok()?,
        };
        Some(Self {
            value,
            text: t.to_string(),
        })
    }
}

impl Default for MasqueradeMark {
    fn default() -> Self {
        Self::from_bit(14)
    }
}

/// Facts about the host that change kube-proxy's iptables output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFeatures {
    /// `iptables` supports `MASQUERADE --random-fully`.
    pub random_fully: bool,
    /// `net.netfilter.nf_conntrack_tcp_be_liberal` is set (no INVALID drop rule then).
    pub tcp_be_liberal: bool,
    /// The nfacct counter `ct_state_invalid_dropped_pkts` exists.
    pub nfacct_invalid_dropped: bool,
    /// The nfacct counter `localhost_nps_accepted_pkts` exists.
    pub nfacct_localhost_nodeports: bool,
}

impl Default for HostFeatures {
    fn default() -> Self {
        Self {
            random_fully: true,
            tcp_be_liberal: false,
            nfacct_invalid_dropped: false,
            nfacct_localhost_nodeports: false,
        }
    }
}

/// iptables mode's own writer settings (with the shared ones in [`WriterOptions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IptablesOptions {
    /// Endpoint count above which kube-proxy drops per-endpoint comments and cleans up
    /// stale chains only once per sync period.
    pub large_cluster_threshold: usize,
}

impl Default for IptablesOptions {
    fn default() -> Self {
        Self {
            large_cluster_threshold: 1000,
        }
    }
}

/// ipvs mode's own writer settings (with the shared ones in [`WriterOptions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsOptions {
    /// `--ipvs-scheduler`.
    pub scheduler: String,
}

impl Default for IpvsOptions {
    fn default() -> Self {
        Self {
            scheduler: "rr".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_text_follows_go_zero_padding_or_the_literal() {
        assert_eq!(MasqueradeMark::from_bit(14).text, "0x00004000");
        let m = MasqueradeMark::literal("0x4000").expect("mark");
        assert_eq!((m.value, m.text.as_str()), (0x4000, "0x4000"));
    }
}
