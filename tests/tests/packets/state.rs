//! Per-flow state in both families: removed backends, ClientIP affinity, established flows
//! on their conntrack entry alone, the counters' rows per CPU, an assured flow's pending
//! counts.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use lb_userspace::{
    datapath::kernel::KernelMaps,
    list,
    model::IpFamily,
    packet::{TCP_ACK, TCP_SYN},
    source::file,
};
use xlb_tests::datapath::{LoadedDatapath, reason_counts};
use xlb_tests::suites::packets::{Family, TC_ACT_OK, frame, in_both_families, service_of};

const FIN: u8 = 0x01;

#[test]
fn a_removed_backend_keeps_tcp_flows_and_rebalances_udp() {
    in_both_families(removed_backend);
}

fn removed_backend(f: &Family, dp: &mut LoadedDatapath) {
    let (web, dns) = (SocketAddr::new(f.vip, 80), SocketAddr::new(f.vip, 53));
    let c = f.client(40000);
    let to = |dp: &mut LoadedDatapath, pkt: &[u8], what: &str| f.through(dp, pkt, &f.row(what)).dst;
    let tcp_backend = to(dp, &frame(false, c, web, TCP_SYN, b""), "TCP SYN");
    let udp_backend = to(dp, &frame(true, c, dns, 0, b""), "UDP");
    // The UDP flow is answered and goes on: assured (its entries in the assured table), so
    // its re-balancing below must also take its assured entry away.
    f.through(
        dp,
        &frame(true, udp_backend, c, 0, b"answer"),
        &f.row("UDP answer"),
    );
    let next = to(dp, &frame(true, c, dns, 0, b"next"), "UDP next");
    assert_eq!(next, udp_backend, "{}", f.row("UDP next"));

    // Each flow's backend leaves its service.
    let others = |gone: &SocketAddr| -> Vec<IpAddr> {
        f.backends
            .iter()
            .copied()
            .filter(|b| *b != gone.ip())
            .collect()
    };
    let yaml = service_of("web", f.vip, 80, "TCP", 8080, &others(&tcp_backend))
        + &service_of("dns", f.vip, 53, "UDP", 5353, &others(&udp_backend));
    dp.program(&file::parse("t.yaml", &yaml).expect("yaml").model)
        .expect("reprogram");

    let what = f.row("an established TCP flow keeps its backend");
    let later_tcp = frame(false, c, web, TCP_ACK, b"more");
    assert_eq!(to(dp, &later_tcp, &what), tcp_backend, "{what}");
    let what = f.row("a UDP flow to a removed backend must move");
    let later_udp = frame(true, c, dns, 0, b"again");
    let moved = to(dp, &later_udp, &what);
    assert_ne!(moved, udp_backend, "{what}");
    assert!(f.backends.contains(&moved.ip()), "{what}: {moved}");
    let what = f.row("and then stay on its new backend");
    assert_eq!(to(dp, &later_udp, &what), moved, "{what}");
    let counts = reason_counts(&dp.pins);
    assert_eq!(counts["backend_gone"], 1, "{}: {counts:?}", f.name());
}

/// Sets sessionAffinity ClientIP with `timeout_s` (0 = off) on the frontend VIP:80/TCP.
fn set_affinity(f: &Family, dp: &mut LoadedDatapath, timeout_s: u32) {
    use lb_userspace::datapath::writer::MapWriter;
    let state = dp.state();
    let (k, v) = state
        .services
        .iter()
        .find(|(k, _)| u16::from_be(k.port_be) == 80 && k.addr_be == Family::words(f.vip))
        .map(|(k, v)| (*k, v.value))
        .expect("web entry");
    let v = lb_common::SvcValue {
        affinity_timeout_s: timeout_s,
        ..v
    };
    dp.maps.put_svc(&k, &v).expect("write entry");
}

#[test]
fn client_ip_affinity_keeps_a_client_on_its_backend_until_it_expires() {
    in_both_families(affinity);
}

fn affinity(f: &Family, dp: &mut LoadedDatapath) {
    let web = SocketAddr::new(f.vip, 80);
    let backend_of = |dp: &mut LoadedDatapath, client: IpAddr, port: u16| {
        let syn = frame(false, SocketAddr::new(client, port), web, TCP_SYN, b"");
        f.through(dp, &syn, &f.row("affinity")).dst.ip()
    };
    // Off: one client's new connections spread.
    let spread: std::collections::BTreeSet<IpAddr> = (0..30)
        .map(|i| backend_of(dp, f.client, 30000 + i))
        .collect();
    assert!(
        spread.len() > 1,
        "{}",
        f.row("without affinity one client must reach several backends")
    );

    // On: every client sticks to its first backend.
    set_affinity(f, dp, 1);
    let clients: Vec<IpAddr> = (10..22).map(|i| f.other_client(i)).collect();
    let first: Vec<IpAddr> = clients.iter().map(|c| backend_of(dp, *c, 40000)).collect();
    for (c, b) in clients.iter().zip(&first) {
        for port in 40001..40011 {
            assert_eq!(
                backend_of(dp, *c, port),
                *b,
                "{}",
                f.row(&format!("client {c} left its backend"))
            );
        }
    }
    // After the timeout without packets, new connections are balanced again.
    std::thread::sleep(Duration::from_millis(2100));
    let moved = clients
        .iter()
        .zip(&first)
        .filter(|(c, b)| backend_of(dp, **c, 41000) != **b)
        .count();
    assert!(
        moved > 0,
        "{}",
        f.row("affinity never expired (12 clients all re-picked their old backend)")
    );

    // Switching it off takes effect at once.
    set_affinity(f, dp, 0);
    let spread: std::collections::BTreeSet<IpAddr> = (0..30)
        .map(|i| backend_of(dp, clients[0], 42000 + i))
        .collect();
    assert!(
        spread.len() > 1,
        "{}",
        f.row("affinity still applied after it was switched off")
    );
}

/// The web frontend's service index and the chosen backend's index in the lists.
fn indices(f: &Family, dp: &LoadedDatapath, backend: SocketAddr) -> (u32, u32) {
    let pins = xlb_tests::pins(&dp.pins);
    let web = Family::tcp_frontend(f.vip, 80);
    let svc = list::services(&pins)
        .expect("services")
        .iter()
        .find(|r| r.frontend == web)
        .unwrap_or_else(|| panic!("{}", f.row("web listed")))
        .id;
    let be = list::backends(&pins)
        .expect("backends")
        .iter()
        .find(|b| b.backend.starts_with(&format!("{backend}/")))
        .unwrap_or_else(|| panic!("{}", f.row("the chosen backend listed")))
        .id;
    (svc, be)
}

/// An established packet needs only its conntrack entry (which names the backend, the
/// counters' indices and whether the service has affinity), in both families: a TCP flow
/// keeps its backend even once its service is gone from the service map, as kube-proxy's
/// conntrack keeps it, and its packets still count toward the service.
#[test]
fn an_established_tcp_flow_needs_only_its_conntrack_entry() {
    in_both_families(established_alone);
}

fn established_alone(f: &Family, dp: &mut LoadedDatapath) {
    let (web, c) = (SocketAddr::new(f.vip, 80), f.client(40000));
    let backend = f
        .through(dp, &frame(false, c, web, TCP_SYN, b""), &f.row("SYN"))
        .dst;
    let (id, _) = indices(f, dp, backend);
    // Every service goes: the service map is empty.
    dp.program(&lb_userspace::model::Model::default())
        .expect("reprogram");
    assert!(dp.state().services.is_empty());
    let what = f.row("the flow keeps its backend");
    let later = frame(false, c, web, TCP_ACK, b"more");
    assert_eq!(f.through(dp, &later, &what).dst, backend, "{what}");
    let what = f.row("its replies still come from the frontend");
    let reply = frame(false, backend, c, TCP_ACK, b"");
    assert_eq!(f.through(dp, &reply, &what).src, web, "{what}");
    let counts = reason_counts(&dp.pins);
    assert_eq!(counts["established"], 1, "{}: {counts:?}", f.name());
    assert_eq!(counts["reverse_nat"], 1, "{}: {counts:?}", f.name());
    // A new flow to the removed frontend is not translated.
    let new = frame(false, f.client(40999), web, TCP_SYN, b"");
    let r = dp.run(&new).expect("run");
    assert_eq!(
        r.packet,
        new,
        "{}",
        f.row("a new flow to a removed service passes untouched")
    );
    // The flow's packets were counted under its service index (the counter array slot).
    let maps = KernelMaps::open(&xlb_tests::pins(&dp.pins)).expect("maps");
    assert_eq!(
        maps.service_counter(id).packets,
        3,
        "{}",
        f.row("SYN, later packet, reply")
    );
}

/// Runs `f` with this thread pinned to `cpu` (restoring its affinity after); `None` when
/// the machine has no such CPU.
pub(crate) fn on_cpu<T>(cpu: usize, f: impl FnOnce() -> T) -> Option<T> {
    // SAFETY: plain syscalls on this thread's own CPU mask, restored before returning.
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut old) != 0 {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        if libc::sched_setaffinity(0, size, &one) != 0 {
            return None;
        }
        let out = f();
        libc::sched_setaffinity(0, size, &old);
        Some(out)
    }
}

/// The service and backend counters have a row per CPU (`XLB_SVCSTAT_V3`,
/// `XLB_BESTAT_V3`), in both families: a packet is counted in the row of the CPU that ran
/// it, at `cpu × stride + index`, and the readers (`xlb list`, metrics) sum the rows.
#[test]
fn counters_land_in_the_running_cpus_row_and_readers_sum_the_rows() {
    in_both_families(counter_rows);
}

fn counter_rows(f: &Family, dp: &mut LoadedDatapath) {
    use aya::maps::{Array, MapData};
    use lb_common::{Counter, MAP_BACKEND_STATS, MAP_SVC_STATS};
    use lb_userspace::datapath::rows;

    let cpus = rows::cpus().expect("cpus") as usize;
    assert!(
        cpus >= 2,
        "this test needs two CPUs to tell the rows apart ({cpus} possible)"
    );
    let (web, c) = (SocketAddr::new(f.vip, 80), f.client(40000));
    // One new flow on CPU 0, its next packet on CPU 1, another on CPU 1.
    let syn = frame(false, c, web, TCP_SYN, b"");
    let ack = frame(false, c, web, TCP_ACK, b"");
    let r = on_cpu(0, || dp.run(&syn).expect("run")).expect("pin to CPU 0");
    let backend = xlb_tests::suites::packets::seen(&r.packet, &f.row("SYN")).dst;
    for _ in 0..2 {
        on_cpu(1, || dp.run(&ack).expect("run")).expect("pin to CPU 1");
    }
    let (svc_id, backend_id) = indices(f, dp, backend);
    let pins = xlb_tests::pins(&dp.pins);
    for (name, id) in [(MAP_SVC_STATS, svc_id), (MAP_BACKEND_STATS, backend_id)] {
        let what = f.row(name);
        let array: Array<MapData, Counter> =
            Array::try_from(pins.map(name).expect("open")).expect("an array");
        let stride = array.len() / cpus as u32;
        let packets = |cpu: u32| array.get(&(cpu * stride + id), 0).expect("read").packets;
        assert_eq!(
            (packets(0), packets(1)),
            (1, 2),
            "{what}: index {id} in CPU 0's and CPU 1's rows (stride {stride})"
        );
        let mut summed = Counter::default();
        rows::sums(pins.get(name).expect("open"), name, |i, c| {
            if i == id {
                summed = c;
            }
        })
        .expect("sums");
        assert_eq!(summed.packets, 3, "{what}: the readers' sum of the rows");
    }
    let maps = KernelMaps::open(&pins).expect("maps");
    assert_eq!(maps.service_counter(svc_id).packets, 3, "{}", f.name());
    assert_eq!(maps.backend_counter(backend_id).packets, 3, "{}", f.name());
}

/// An assured flow's packets wait in its conntrack entries (`CtValue::pending`) instead of
/// going to the counter rows one by one, in both families: `xlb list` adds them to the rows
/// (the rows alone, `KernelMaps::service_counter`, lag behind), and they reach the rows on
/// the entry's refresh (its first packet a second on), and with the flow's FIN.
#[test]
fn an_assured_flows_counts_wait_in_its_entries_until_a_refresh_or_its_fin() {
    in_both_families(pending_counts);
}

fn pending_counts(f: &Family, dp: &mut LoadedDatapath) {
    let (web, c) = (SocketAddr::new(f.vip, 80), f.client(40000));
    let syn = frame(false, c, web, TCP_SYN, b"");
    let backend = f.through(dp, &syn, &f.row("SYN")).dst;
    let (svc_id, backend_id) = indices(f, dp, backend);
    let pins = xlb_tests::pins(&dp.pins);
    let mut sent = (1u64, syn.len() as u64);
    let mut send = |dp: &mut LoadedDatapath, packet: Vec<u8>| {
        let r = dp.run(&packet).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{}", f.name());
        sent = (sent.0 + 1, sent.1 + packet.len() as u64);
        sent
    };
    // (rows, rows and pending as `xlb list` shows them), for the service and its backend.
    let counts = || {
        let maps = KernelMaps::open(&pins).expect("maps");
        let svc = list::services(&pins).expect("services");
        let svc = svc.iter().find(|r| r.id == svc_id).expect("web");
        let be = list::backends(&pins).expect("backends");
        let be = be.iter().find(|b| b.id == backend_id).expect("backend");
        let (s, b) = (
            maps.service_counter(svc_id),
            maps.backend_counter(backend_id),
        );
        assert_eq!(
            ((s.packets, s.bytes), (svc.packets, svc.bytes)),
            ((b.packets, b.bytes), (be.packets, be.bytes)),
            "{}: the backend's counts are the service's (one backend)",
            f.name()
        );
        ((s.packets, s.bytes), (svc.packets, svc.bytes))
    };
    let data = |flags| frame(false, c, web, flags, b"request");
    let answer = |flags| frame(false, backend, c, flags, b"answer");
    // Not assured yet: the SYN and the first answer go straight to the rows.
    let straight = send(dp, answer(TCP_SYN | TCP_ACK));
    assert_eq!(counts(), (straight, straight), "{}", f.row("not assured"));
    // Assured by the client's next packet: these wait in the entries, both ways.
    send(dp, data(TCP_ACK));
    send(dp, data(TCP_ACK));
    let all = send(dp, answer(TCP_ACK));
    assert_eq!(
        counts(),
        (straight, all),
        "{}",
        f.row("the rows have the flow's first two packets; `xlb list` all of them")
    );
    // A second on, the forward entry's next packet moves its pending counts to the rows
    // (and waits itself); the reply entry's wait on.
    std::thread::sleep(Duration::from_millis(1100));
    let before_refresh = all;
    let all = send(dp, data(TCP_ACK));
    let answer_len = answer(TCP_ACK).len() as u64;
    assert_eq!(
        counts(),
        ((before_refresh.0 - 1, before_refresh.1 - answer_len), all),
        "{}",
        f.row("refreshed: the forward entry's counts are in the rows, the answer's and this packet's wait")
    );
    // The FIN of each way moves its entry's counts (and itself) to the rows.
    send(dp, data(TCP_ACK | FIN));
    let all = send(dp, answer(TCP_ACK | FIN));
    assert_eq!(
        counts(),
        (all, all),
        "{}",
        f.row("nothing waits after both FINs")
    );
}

/// The forward entry of the family's one flow in its assured table: with `set_pending`,
/// its pending counts set to that and its last refresh to 0 (the next packet refreshes it),
/// written back; its service index and pending counts.
fn assured_forward(f: &Family, dp: &LoadedDatapath, set_pending: Option<u32>) -> (u32, u32) {
    use aya::maps::{HashMap, MapData};
    use lb_common::{CT_DIR_FORWARD, CtKey, CtKey6, CtValue, CtValue6};
    let pins = xlb_tests::pins(&dp.pins);
    macro_rules! poke {
        ($map:expr, $k:ty, $v:ty) => {{
            let mut table: HashMap<MapData, $k, $v> =
                HashMap::try_from(pins.map($map).expect("open")).expect("a hash");
            let (key, mut value) = table
                .iter()
                .map(|e| e.expect("entry"))
                .find(|(k, _)| k.dir == CT_DIR_FORWARD)
                .unwrap_or_else(|| panic!("{}", f.row("the assured forward entry")));
            if let Some(p) = set_pending {
                value.pending = p;
                value.last_seen_ns = 0;
                table.insert(key, value, 0).expect("write");
            }
            (value.svc_id, value.pending)
        }};
    }
    match f.family {
        IpFamily::V4 => poke!(lb_common::MAP_CT_ASSURED, CtKey, CtValue),
        IpFamily::V6 => poke!(lb_common::MAP_CT6_ASSURED, CtKey6, CtValue6),
    }
}

/// What two CPUs' flushes of one entry at the same moment leave in its pending counts (the
/// negation of what both took out) is taken out at the entry's next refresh without being
/// counted, in both families: the rows do not jump by hundreds of packets.
#[test]
fn a_negated_pending_count_is_cleared_without_counting() {
    in_both_families(negated_pending);
}

fn negated_pending(f: &Family, dp: &mut LoadedDatapath) {
    let (web, c) = (SocketAddr::new(f.vip, 80), f.client(40000));
    let syn = frame(false, c, web, TCP_SYN, b"");
    let backend = f.through(dp, &syn, &f.row("SYN")).dst;
    let answer = frame(false, backend, c, TCP_SYN | TCP_ACK, b"");
    let ack = frame(false, c, web, TCP_ACK, b"");
    for p in [&answer, &ack] {
        f.through(dp, p, &f.row("assured"));
    }
    // Three packets of 60 B taken out twice: 0 - 3 packets - 180 B.
    let negated = 0u32.wrapping_sub(3 * lb_common::CT_PENDING_PACKET + 180);
    let (svc_id, _) = assured_forward(f, dp, Some(negated));
    let pins = xlb_tests::pins(&dp.pins);
    let before = KernelMaps::open(&pins)
        .expect("maps")
        .service_counter(svc_id);
    // The refresh: the pending counts leave the entry; this packet waits in it.
    f.through(dp, &ack, &f.row("the refresh"));
    let after = KernelMaps::open(&pins)
        .expect("maps")
        .service_counter(svc_id);
    assert_eq!(
        (after.packets, after.bytes),
        (before.packets, before.bytes),
        "{}",
        f.row("the negation is not counted")
    );
    let (_, pending) = assured_forward(f, dp, None);
    assert_eq!(
        lb_common::ct_pending(pending),
        (1, ack.len() as u32),
        "{}",
        f.row("only the last packet waits")
    );
}
