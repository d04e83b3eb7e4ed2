//! Reason codes: the index of each per-CPU counter in `XLB_STATS_V8`.
//!
//! Every verdict the datapath reaches bumps exactly one of these.

/// Not a service packet, nor a reply of a tracked flow: passed untouched.
pub const R_PASS: u32 = 0;
/// New flow to a service: backend chosen, conntrack created, DNATed.
pub const R_NEW_FLOW: u32 = 1;
/// Packet of a tracked flow: DNATed to its backend.
pub const R_ESTABLISHED: u32 = 2;
/// Reply from a backend: source restored to the VIP (tc egress, XDP).
pub const R_REVERSE_NAT: u32 = 3;
/// Service has no usable backend and must not be refused (or cannot be): dropped.
pub const R_NO_BACKEND: u32 = 4;
/// IPv4 header or L4 header truncated or invalid: dropped.
pub const R_MALFORMED: u32 = 5;
/// IP fragment (ports not visible): passed untouched.
pub const R_FRAGMENT: u32 = 6;
/// A backend slot or backend id vanished mid-update: dropped (retransmission recovers).
pub const R_STALE_SLOT: u32 = 7;
/// A helper that rewrites the packet failed: dropped.
pub const R_REWRITE_FAILED: u32 = 8;
/// The conntrack map refused an insert: dropped (the reply could not be reverse-NATed).
pub const R_CT_FULL: u32 = 9;
/// Tracked flow whose backend was removed (UDP, or a new TCP connection on its tuple): a new
/// backend was chosen.
pub const R_BACKEND_GONE: u32 = 10;

/// Service has no endpoints: refused (TCP RST, ICMP port unreachable), as kube-proxy's REJECT.
pub const R_REJECT: u32 = 11;

/// Source address outside a LoadBalancer IP's loadBalancerSourceRanges: dropped.
pub const R_SRC_DENIED: u32 = 12;
/// No free SNAT port for a new flow to a remote backend (or no source address): dropped.
pub const R_SNAT_FAILED: u32 = 13;
/// ICMP error about a translated flow: its outer and quoted inner headers translated too.
pub const R_ICMP_XLATE: u32 = 14;
/// A translated packet with DF set is too big for its route: answered with ICMP
/// fragmentation needed from the frontend (path-MTU discovery through the service).
pub const R_FRAG_NEEDED: u32 = 15;
/// XDP: a packet was translated and redirected out of its egress interface by XDP.
pub const R_XDP_REDIRECT: u32 = 16;

/// Socket hook: a connect() or an unconnected UDP sendmsg() to a frontend was sent to a
/// backend instead (connect-time load balancing: no per-packet NAT for that socket).
pub const R_SOCK_XLATE: u32 = 17;
/// Socket hook: a connect()/sendmsg() to a frontend without endpoints failed at once with
/// ECONNREFUSED (kube-proxy's REJECT).
pub const R_SOCK_REJECT: u32 = 18;
/// Socket hook: a connect()/sendmsg() to a frontend whose Local traffic policy leaves no
/// endpoint (or whose source ranges exclude it) failed at once with EHOSTUNREACH
/// (kube-proxy drops; a socket cannot wait).
pub const R_SOCK_UNREACH: u32 = 19;
/// Socket hook: recvmsg()/getpeername() showed the frontend instead of the backend.
pub const R_SOCK_REVNAT: u32 = 20;
/// Socket hook: not a frontend (or a namespace the hooks leave to tc): untouched.
pub const R_SOCK_PASS: u32 = 21;

/// A TCP packet other than a SYN to a frontend matched no flow (its conntrack entry was
/// evicted from a full map, or the connection predates xlb): a backend is chosen for it
/// anyway, as conntrack picks up a connection mid-stream (`nf_conntrack_tcp_loose`).
pub const R_CT_MISS: u32 = 22;

/// An answered flow found the assured conntrack table (`XLB_CTA_V1`) full: it stays in the
/// LRU table, where a flood of new flows may evict it. Counted once per packet that tried.
pub const R_CT_ASSURED_FULL: u32 = 23;

/// tc ingress: a reply from a backend of a tracked flow, its destination restored to the
/// client where the flow was SNATed (its source waits for tc egress: netfilter sees it as
/// backend → client, as under kube-proxy).
pub const R_REPLY_IN: u32 = 24;

/// tc egress: a request of a SNATed flow leaves with the SNAT source (after netfilter saw it
/// as client → backend, as kube-proxy's MASQUERADE in POSTROUTING).
pub const R_SNAT_OUT: u32 = 25;

/// tc ingress: a UDP packet or TCP SYN from a client straight to a backend, on the tuple a
/// translated flow's replies come back on: the client talks to the backend itself now (the
/// socket hooks translated it), so that flow's entries went (`conntrack::supersede`) and the
/// packet passed untouched. After a takeover, kube-proxy's adopted flows end this way when a
/// pod reuses their ports.
pub const R_CT_SUPERSEDED: u32 = 26;

/// tc egress on a backend's node: a client's packet that another node forwarded by direct
/// server return (`--lb-mode dsr|hybrid`), carrying the frontend in an IPv4 option
/// ([`crate::DSR_OPT_TYPE`]) or an IPv6 destination option ([`crate::DSR6_OPT_TYPE`]), on its way to the backend: the flow is recorded here so its
/// replies leave this node with the frontend as source, straight to the client.
pub const R_DSR_IN: u32 = 27;

/// tc egress on the node that chose a remote backend by DSR: a packet of the flow that the
/// backend's node learns it from (a TCP SYN, a UDP datagram) leaves with the option.
pub const R_DSR_OUT: u32 = 28;

/// Number of counters (the size of `XLB_STATS_V8`).
pub const R_COUNT: u32 = 29;

/// Human names, indexed by reason code.
pub const REASON_NAMES: [&str; R_COUNT as usize] = [
    "pass",
    "new_flow",
    "established",
    "reverse_nat",
    "no_backend",
    "malformed",
    "fragment",
    "stale_slot",
    "rewrite_failed",
    "ct_full",
    "backend_gone",
    "reject",
    "src_denied",
    "snat_failed",
    "icmp_xlate",
    "frag_needed",
    "xdp_redirect",
    "sock_xlate",
    "sock_reject",
    "sock_unreach",
    "sock_revnat",
    "sock_pass",
    "ct_miss",
    "ct_assured_full",
    "reply_in",
    "snat_out",
    "ct_superseded",
    "dsr_in",
    "dsr_out",
];
