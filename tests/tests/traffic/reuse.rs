//! Reused tuples and flows across a layout upgrade: the client's port kept, direct
//! connections left alone, the previous layout's flows taken over.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use xlb_tests::suites::traffic::{DNS, TIMEOUT, WEB, backends, synced, yaml};
use xlb_tests::{
    client::tcp_request,
    scenario::{Scenario, TCP_PORT, sock},
};

/// One request to `to` from the client's port `port` (SO_REUSEADDR, so a port whose last
/// connection is in TIME_WAIT can be bound again); the answer's line. Must run in the
/// client's namespace.
fn request_from_port(
    from: Ipv4Addr,
    port: u16,
    to: std::net::SocketAddr,
) -> Result<String, String> {
    use std::io::{BufRead, BufReader, Write};
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| e.to_string())?;
    sock.set_reuse_address(true).map_err(|e| e.to_string())?;
    sock.bind(&std::net::SocketAddr::from((from, port)).into())
        .map_err(|e| format!("bind :{port}: {e}"))?;
    sock.connect_timeout(&to.into(), TIMEOUT)
        .map_err(|e| format!("connect {to} from :{port}: {e}"))?;
    let mut s: std::net::TcpStream = sock.into();
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.write_all(b"hello\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    Ok(line)
}

/// A client reusing a 4-tuple through a ClusterIP once its last connection is over (TIME_WAIT
/// reuse, `net.ipv4.tcp_tw_reuse=1`): the closed flow's own reply entry is no clash, so the
/// backend sees the client's port (kube-proxy's conntrack reuses the entry). Today xlb
/// remaps the port from the SNAT range for every reuse, and a busy client runs the range
/// out (`snat_failed`, connects time out): see `cargo xtask bench traffic`'s tc row.
#[test]
fn a_reused_tuple_through_a_cluster_ip_keeps_the_clients_port() {
    let Some(s) = synced("xtw", 1) else {
        return;
    };
    s.topo
        .client
        .ns
        .sysctl(&["net.ipv4.tcp_tw_reuse=1"])
        .expect("sysctl");
    let client = s.topo.client.ip;
    let (first, again) = s
        .topo
        .client
        .ns
        .run(move || {
            let first = request_from_port(client, 40000, sock(WEB, 80));
            // TIME_WAIT may be reused once its last timestamp is a second old.
            std::thread::sleep(Duration::from_millis(1200));
            (first, request_from_port(client, 40000, sock(WEB, 80)))
        })
        .expect("client");
    for (what, r) in [("first", first), ("again", again)] {
        let line = r.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            line.contains(&format!(" {client}:40000")),
            "{what}: the backend saw {line:?}"
        );
    }
}

/// A pod's connection through a ClusterIP (tc translates it) is closed; the pod then connects
/// from the same port straight to that backend's address (as a socket the hooks translated
/// does). Today the closed flow's reply entry reverse-NATs the new connection's SYN-ACK to
/// the ClusterIP, and the handshake never completes.
#[test]
fn a_closed_flows_reply_entry_leaves_a_direct_connection_from_its_port_alone() {
    let Some(s) = synced("xtd", 1) else {
        return;
    };
    let client = s.topo.client.ip;
    let backend = sock(s.topo.backends[0].ip, TCP_PORT);
    let (via_vip, direct) = s
        .topo
        .client
        .ns
        .run(move || {
            let via_vip = request_from_port(client, 40002, sock(WEB, 80));
            (via_vip, request_from_port(client, 40002, backend))
        })
        .expect("client");
    via_vip.expect("through the ClusterIP");
    direct.unwrap_or_else(|e| panic!("straight to the backend: {e}\n{}", s.agent.log_text()));
}

/// An agent of this layout takes over the pins of the previous one (`lb_common::prev`: 40-byte
/// conntrack keys, hash backends, other ids) without breaking a flow: long-lived TCP
/// connections and UDP flows opened before it starts keep their backends after it has
/// copied their entries over, replaced the programs and removed the previous pins.
#[test]
fn a_new_layout_takes_over_the_previous_layouts_flows_without_breaking_them() {
    let Some(mut s) = upgrade_lab("xu") else {
        return;
    };
    const N: usize = 6;
    let (mut tcp, udp, first) = spread_flows(&s, N);

    // The previous layout's pins, as its agent leaves them; its programs keep forwarding.
    s.agent.stop();
    let entries = xlb_tests::prev_layout::downgrade(&s.agent.pins).expect("previous layout");
    assert!(
        entries >= 4 * N,
        "{entries} conntrack entries for {N}+{N} flows"
    );
    assert_eq!(ask_all(&mut tcp, &udp, "before the upgrade"), first);
    let misses = counts(&s);

    // The new layout's agent on the same pins.
    upgrade(&mut s);
    let text = s.agent.log_text();
    for old in lb_common::prev::REPLACED
        .iter()
        .chain(&lb_common::RETIRED_PINS)
    {
        assert!(
            !s.agent.pins.join(old).exists(),
            "{old} still pinned: {text}"
        );
    }
    assert!(
        text.contains(&format!("conntrack={entries}")),
        "every entry copied: {text}"
    );
    assert_flows_kept(&s, (&mut tcp, &udp, &first), misses);
}

/// An agent with slot ranges takes over the pins of the layout before them (`XLB_SVC_V2`: a
/// service-map entry per backend slot; the backend array, conntrack and affinity shared):
/// it adopts that map's service and backend indices, writes its own service map and slot
/// array while the previous programs keep forwarding, then replaces the programs and
/// removes `XLB_SVC_V2`. Long-lived TCP and UDP flows keep their backends throughout, and
/// none is picked up mid-stream.
#[test]
fn slot_ranges_take_over_the_per_slot_service_map_without_breaking_a_flow() {
    let Some(mut s) = upgrade_lab("xus") else {
        return;
    };
    // web's first backend leaves and comes back: it holds another index and generation than
    // an agent starting afresh would give it, so only adopted indices keep its flows.
    let all = backends(3);
    for (web, n) in [(&all[1..], 2), (&all[..], 3)] {
        xlb_tests::services::write_atomic(&s.yaml, &yaml(web, &all)).expect("yaml");
        s.wait_backends("10.96.0.10:80/TCP", n, Duration::from_secs(30))
            .expect("web's backends");
    }
    const N: usize = 6;
    let (mut tcp, udp, first) = spread_flows(&s, N);

    // The layout before slot ranges, as its agent leaves it; its programs keep forwarding.
    let indices_before = backend_indices(&s);
    s.agent.stop();
    let names = names(&s);
    assert!(!names.is_empty(), "the agent wrote its names");
    let frontends =
        xlb_tests::prev_layout::downgrade_slots(&s.agent.pins).expect("per-slot layout");
    assert!(frontends >= 2, "{frontends} frontends");
    assert_eq!(ask_all(&mut tcp, &udp, "before the upgrade"), first);
    let misses = counts(&s);

    upgrade(&mut s);
    let text = s.agent.log_text();
    assert!(
        text.contains("adopted the indices of the service map before slot ranges"),
        "{text}"
    );
    assert_names_moved(&s, &names);
    assert!(
        !s.agent.pins.join(lb_common::prev::MAP_SVC_V2).exists(),
        "XLB_SVC_V2 still pinned: {text}"
    );
    assert_eq!(
        backend_indices(&s),
        indices_before,
        "every backend keeps its index and generation"
    );
    assert_flows_kept(&s, (&mut tcp, &udp, &first), misses);
}

/// The layout before the names left the kernel (`prev::MAP_SVC_NAME`: a names map, no names
/// file): the agent writes the names to its file, takes over and removes the map's pin.
/// Long-lived TCP and UDP flows keep their backends throughout, none is picked up
/// mid-stream, and the services' counters go on (the indices named keep theirs).
#[test]
fn names_leave_the_kernel_without_breaking_a_flow() {
    let Some(mut s) = upgrade_lab("xun") else {
        return;
    };
    const N: usize = 4;
    let (mut tcp, udp, first) = spread_flows(&s, N);

    // The names in the kernel, as an agent of that layout leaves them.
    s.agent.stop();
    let names = xlb_tests::prev_layout::downgrade_names(&s.agent.pins).expect("names map");
    assert!(names.len() >= 2, "{names:?}");
    assert_eq!(ask_all(&mut tcp, &udp, "before the upgrade"), first);
    let misses = counts(&s);
    let before = counter_rows(&s, &names);
    assert!(
        before.values().any(|n| *n > 0),
        "the flows' first packets are in the counter rows: {before:?}"
    );

    upgrade(&mut s);
    assert_names_moved(&s, &names);
    // No packet since: a service index that kept its counters has the same rows.
    assert_eq!(
        counter_rows(&s, &names),
        before,
        "the services' counters go on (not zeroed as for an index handed out anew)"
    );
    assert_flows_kept(&s, (&mut tcp, &udp, &first), misses);
}

/// The address filters of the layout before the two filters could differ in size
/// (`prev::MAP_ADDR_FILTER`): the agent creates its own of the same size, takes the old bits
/// over (a bit of an address gone less than a day included) before its first sync, takes
/// over and removes the old pin. Long-lived TCP and UDP flows keep their backends
/// throughout, and none is picked up mid-stream.
#[test]
fn the_address_filters_move_to_their_new_layout_without_breaking_a_flow() {
    let Some(mut s) = upgrade_lab("xuf") else {
        return;
    };
    const N: usize = 4;
    let (mut tcp, udp, first) = spread_flows(&s, N);

    s.agent.stop();
    let before = xlb_tests::prev_layout::filter_bits(&s.agent.pins).expect("filter bits");
    assert!(!before.is_empty(), "the agent set its addresses' bits");
    // A bit no address of this lab has: as an address gone less than a day leaves it.
    let extra = (0..u32::MAX)
        .find(|b| !before.contains(b))
        .expect("a clear bit");
    let copied = xlb_tests::prev_layout::downgrade_filter(&s.agent.pins, extra)
        .expect("filters of the layout before");
    assert!(copied > 0, "{copied} words");
    assert_eq!(ask_all(&mut tcp, &udp, "before the upgrade"), first);
    let misses = counts(&s);

    upgrade(&mut s);
    let text = s.agent.log_text();
    assert!(
        text.contains("took the bits of the previous layout's address filters over"),
        "{text}"
    );
    assert!(
        !s.agent.pins.join(lb_common::prev::MAP_ADDR_FILTER).exists(),
        "XLB_ADDRFILT_V1 still pinned: {text}"
    );
    let after = xlb_tests::prev_layout::filter_bits(&s.agent.pins).expect("filter bits");
    assert!(
        before.is_subset(&after) && after.contains(&extra),
        "every bit of the old filters is kept: {before:?} + {extra} ⊄ {after:?}"
    );
    assert_flows_kept(&s, (&mut tcp, &udp, &first), misses);
}

/// A synced lab of 3 backends whose dns service is programmed too.
fn upgrade_lab(tag: &str) -> Option<Scenario> {
    let mut s = synced(tag, 3)?;
    s.wait_backends("10.96.0.53:53/UDP", 3, Duration::from_secs(30))
        .expect("dns programmed");
    Some(s)
}

/// [`open_flows`], spread over more than one backend.
fn spread_flows(
    s: &Scenario,
    n: usize,
) -> (
    Vec<std::net::TcpStream>,
    Vec<std::net::UdpSocket>,
    Vec<String>,
) {
    let flows = open_flows(s, n);
    assert_spread(&flows.2);
    flows
}

/// After an upgrade: each flow still answered by the backend it first had, none picked up
/// mid-stream or lost its backend (`misses` as before), new flows served.
fn assert_flows_kept(
    s: &Scenario,
    (tcp, udp, first): (
        &mut [std::net::TcpStream],
        &[std::net::UdpSocket],
        &[String],
    ),
    misses: (u64, u64),
) {
    assert_eq!(
        ask_all(tcp, udp, "after the upgrade"),
        first,
        "every flow keeps its backend"
    );
    assert_eq!(
        counts(s),
        misses,
        "no flow was picked up mid-stream or lost its backend"
    );
    assert_new_flows_served(s);
}

/// The names in the agent's names file, by service index.
fn names(s: &Scenario) -> std::collections::BTreeMap<u32, String> {
    lb_userspace::datapath::names_file::read(&s.agent.pins)
        .expect("names file")
        .unwrap_or_default()
}

/// The upgraded agent wrote `names` (the previous layout's names map's) to its names file,
/// `xlb list` shows them, and the map's pin is gone.
fn assert_names_moved(s: &Scenario, want: &std::collections::BTreeMap<u32, String>) {
    let text = s.agent.log_text();
    assert!(
        !s.agent.pins.join(lb_common::prev::MAP_SVC_NAME).exists(),
        "{} still pinned: {text}",
        lb_common::prev::MAP_SVC_NAME
    );
    assert_eq!(&names(s), want, "the names file holds the map's names");
    let pins = xlb_tests::pins(&s.agent.pins);
    let rows = lb_userspace::list::services(&pins).expect("xlb list services");
    assert!(
        !rows.is_empty() && rows.iter().all(|r| want.values().any(|n| *n == r.service)),
        "xlb list shows the names: {:?}",
        rows.iter().map(|r| &r.service).collect::<Vec<_>>()
    );
}

/// The packets in the counter rows of each service index `names` names (without what the
/// assured flows hold pending).
fn counter_rows(
    s: &Scenario,
    names: &std::collections::BTreeMap<u32, String>,
) -> std::collections::BTreeMap<u32, u64> {
    let maps = lb_userspace::datapath::kernel::KernelMaps::open(&xlb_tests::pins(&s.agent.pins))
        .expect("open the maps");
    names
        .keys()
        .map(|id| (*id, maps.service_counter(*id).packets))
        .collect()
}

/// Each programmed backend's address and port with its index and generation.
fn backend_indices(s: &Scenario) -> Vec<(String, u32, u32)> {
    use lb_userspace::datapath::{kernel::KernelMaps, writer::MapWriter};
    let state = KernelMaps::open(&xlb_tests::pins(&s.agent.pins))
        .and_then(|m| Ok(m.read()?))
        .expect("read the maps");
    let mut v: Vec<(String, u32, u32)> = state
        .backends
        .iter()
        .map(|(id, b)| (lb_common::user::show_backend(b), *id, b.generation))
        .collect();
    v.sort();
    v
}

/// The flows went to more than one backend.
fn assert_spread(first: &[String]) {
    assert!(
        first
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1,
        "the flows should spread: {first:?}"
    );
}

/// Each TCP connection and UDP socket asked once, `when`: the backends that answered.
fn ask_all(
    tcp: &mut [std::net::TcpStream],
    udp: &[std::net::UdpSocket],
    when: &str,
) -> Vec<String> {
    let mut got = Vec::new();
    for c in tcp.iter_mut() {
        got.push(xlb_tests::client::ask_tcp(c).unwrap_or_else(|e| panic!("TCP flow {when}: {e}")));
    }
    for u in udp {
        got.push(xlb_tests::client::ask_udp(u).unwrap_or_else(|e| panic!("UDP flow {when}: {e}")));
    }
    got
}

/// Flows picked up mid-stream and flows whose backend went, so far.
fn counts(s: &Scenario) -> (u64, u64) {
    let c = xlb_tests::datapath::reason_counts(&s.agent.pins);
    (c["ct_miss"], c["backend_gone"])
}

/// New connections to web are served (by the programs now attached).
fn assert_new_flows_served(s: &Scenario) {
    let answers = s
        .topo
        .client
        .ns
        .run(|| {
            (0..10)
                .map(|_| tcp_request(sock(WEB, 80), TIMEOUT))
                .collect::<Result<Vec<_>, _>>()
        })
        .expect("client thread")
        .expect("new connections after the upgrade");
    assert_eq!(answers.len(), 10);
}

/// Long-lived flows: `n` TCP connections and `n` connected UDP sockets to web and dns, and
/// the backend each answered from first.
fn open_flows(
    s: &Scenario,
    n: usize,
) -> (
    Vec<std::net::TcpStream>,
    Vec<std::net::UdpSocket>,
    Vec<String>,
) {
    type Flows = (
        Vec<std::net::TcpStream>,
        Vec<std::net::UdpSocket>,
        Vec<String>,
    );
    s.topo
        .client
        .ns
        .run(move || -> Result<Flows, String> {
            let (mut tcp, mut udp, mut first) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..n {
                let mut c = std::net::TcpStream::connect_timeout(&sock(WEB, 80), TIMEOUT)
                    .map_err(|e| format!("connect: {e}"))?;
                c.set_read_timeout(Some(TIMEOUT))
                    .map_err(|e| e.to_string())?;
                first.push(xlb_tests::client::ask_tcp(&mut c)?);
                tcp.push(c);
            }
            for _ in 0..n {
                let u = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
                u.connect(sock(DNS, 53)).map_err(|e| e.to_string())?;
                u.set_read_timeout(Some(TIMEOUT))
                    .map_err(|e| e.to_string())?;
                first.push(xlb_tests::client::ask_udp(&u)?);
                udp.push(u);
            }
            Ok((tcp, udp, first))
        })
        .expect("client thread")
        .expect("long-lived flows")
}

/// Restarts the agent (this layout) on the previous layout's pins; waits for its takeover.
fn upgrade(s: &mut Scenario) {
    let log = s.workdir.join("agent-upgraded.log");
    s.agent.restart(log).expect("restart");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !s.agent.log_text().contains("took over") {
        assert!(
            Instant::now() < deadline,
            "no takeover: {}",
            s.agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
