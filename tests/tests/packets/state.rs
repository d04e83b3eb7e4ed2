//! Per-flow state: removed backends, refusal without endpoints, ClientIP affinity,
//! established flows on their conntrack entry alone.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use lb_userspace::{
    packet::{PacketBuilder, TCP_ACK, parse},
    source::file,
};
use xlb_tests::suites::packets::{BACKENDS, CLIENT, TC_ACT_OK, VIP, setup};
use xlb_tests::{datapath::LoadedDatapath, services::service_yaml};

#[test]
fn a_removed_backend_keeps_tcp_flows_and_rebalances_udp() {
    let Some(mut dp) = setup() else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let dns = SocketAddrV4::new(VIP, 53);
    let first = |dp: &mut LoadedDatapath, pkt: &[u8]| {
        let r = dp.run(pkt).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        parse(&r.packet).expect("parses").dst
    };
    let tcp_backend = first(&mut dp, &PacketBuilder::tcp(CLIENT, web).build());
    let udp_backend = first(&mut dp, &PacketBuilder::udp(CLIENT, dns).build());
    // The UDP flow is answered and goes on: assured (its entries in the assured table), so
    // its re-balancing below must also take its assured entry away.
    let r = dp
        .run(
            &PacketBuilder::udp(udp_backend, CLIENT)
                .payload(b"answer")
                .build(),
        )
        .expect("run");
    assert_eq!(r.verdict, TC_ACT_OK);
    assert_eq!(
        first(
            &mut dp,
            &PacketBuilder::udp(CLIENT, dns).payload(b"next").build()
        ),
        udp_backend
    );

    // Each flow's backend leaves its service.
    let others = |gone: &SocketAddrV4| {
        BACKENDS
            .iter()
            .copied()
            .filter(|b| b != gone.ip())
            .collect::<Vec<_>>()
    };
    let yaml = service_yaml("web", VIP, 80, "TCP", 8080, &others(&tcp_backend))
        + &service_yaml("dns", VIP, 53, "UDP", 5353, &others(&udp_backend));
    dp.program(&file::parse("t.yaml", &yaml).expect("yaml").model)
        .expect("reprogram");

    let later_tcp = PacketBuilder::tcp(CLIENT, web)
        .flags(TCP_ACK)
        .payload(b"more")
        .build();
    assert_eq!(
        first(&mut dp, &later_tcp),
        tcp_backend,
        "an established TCP flow keeps its backend"
    );
    let later_udp = PacketBuilder::udp(CLIENT, dns).payload(b"again").build();
    let moved = first(&mut dp, &later_udp);
    assert_ne!(
        moved, udp_backend,
        "a UDP flow to a removed backend must move"
    );
    assert!(BACKENDS.contains(moved.ip()));
    assert_eq!(
        first(&mut dp, &later_udp),
        moved,
        "and then stay on its new backend"
    );
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["backend_gone"], 1, "{counts:?}");
}

/// Sets sessionAffinity ClientIP with `timeout_s` (0 = off) on the frontend VIP:80/TCP.
fn set_affinity(dp: &mut LoadedDatapath, timeout_s: u32) {
    use lb_userspace::datapath::writer::MapWriter;
    let state = dp.state();
    let (k, v) = state
        .services
        .iter()
        .find(|(k, _)| {
            u16::from_be(k.port_be) == 80 && k.addr_be[0] == u32::from_ne_bytes(VIP.octets())
        })
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
    let Some(mut dp) = setup() else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let backend_of = |dp: &mut LoadedDatapath, client: Ipv4Addr, port: u16| {
        let r = dp
            .run(&PacketBuilder::tcp(SocketAddrV4::new(client, port), web).build())
            .expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        *parse(&r.packet).expect("parses").dst.ip()
    };
    // Off: one client's new connections spread.
    let spread: std::collections::BTreeSet<Ipv4Addr> = (0..30)
        .map(|i| backend_of(&mut dp, *CLIENT.ip(), 30000 + i))
        .collect();
    assert!(
        spread.len() > 1,
        "without affinity one client must reach several backends"
    );

    // On: every client sticks to its first backend.
    set_affinity(&mut dp, 1);
    let clients: Vec<Ipv4Addr> = (10..22).map(|i| Ipv4Addr::new(10, 244, 9, i)).collect();
    let first: Vec<Ipv4Addr> = clients
        .iter()
        .map(|c| backend_of(&mut dp, *c, 40000))
        .collect();
    for (c, b) in clients.iter().zip(&first) {
        for port in 40001..40011 {
            assert_eq!(
                backend_of(&mut dp, *c, port),
                *b,
                "client {c} left its backend"
            );
        }
    }
    // After the timeout without packets, new connections are balanced again.
    std::thread::sleep(Duration::from_millis(2100));
    let moved = clients
        .iter()
        .zip(&first)
        .filter(|(c, b)| backend_of(&mut dp, **c, 41000) != **b)
        .count();
    assert!(
        moved > 0,
        "affinity never expired (12 clients all re-picked their old backend)"
    );

    // Switching it off takes effect at once.
    set_affinity(&mut dp, 0);
    let spread: std::collections::BTreeSet<Ipv4Addr> = (0..30)
        .map(|i| backend_of(&mut dp, clients[0], 42000 + i))
        .collect();
    assert!(
        spread.len() > 1,
        "affinity still applied after it was switched off"
    );
}

/// An established packet needs only its conntrack entry (which names the backend, the
/// counters' indices and whether the service has affinity): a TCP flow keeps its backend
/// even once its service is gone from the service map, as kube-proxy's conntrack keeps it,
/// and its packets still count toward the service.
#[test]
fn an_established_tcp_flow_needs_only_its_conntrack_entry() {
    let Some(mut dp) = setup() else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let r = dp
        .run(&PacketBuilder::tcp(CLIENT, web).build())
        .expect("run");
    let backend = parse(&r.packet).expect("parses").dst;
    let before = lb_userspace::list::services(&xlb_tests::pins(&dp.pins)).expect("services");
    let id = before
        .iter()
        .find(|r| r.frontend == "10.96.0.10:80/TCP")
        .expect("web")
        .id;
    // Every service goes: the service map is empty.
    dp.program(&lb_userspace::model::Model::default())
        .expect("reprogram");
    assert!(dp.state().services.is_empty());
    let later = PacketBuilder::tcp(CLIENT, web)
        .flags(TCP_ACK)
        .payload(b"more")
        .build();
    let r = dp.run(&later).expect("run");
    assert_eq!(r.verdict, TC_ACT_OK);
    let p = parse(&r.packet).expect("parses");
    assert_eq!(p.dst, backend, "the flow keeps its backend");
    assert!(p.ip_checksum_ok && p.l4_checksum_ok);
    let reply = PacketBuilder::tcp(backend, CLIENT).flags(TCP_ACK).build();
    let p = parse(&dp.run(&reply).expect("run").packet).expect("parses");
    assert_eq!(p.src, web, "its replies still come from the frontend");
    let counts = xlb_tests::datapath::reason_counts(&dp.pins);
    assert_eq!(counts["established"], 1, "{counts:?}");
    assert_eq!(counts["reverse_nat"], 1, "{counts:?}");
    // A new flow to the removed frontend is not translated.
    let new = PacketBuilder::tcp(SocketAddrV4::new(*CLIENT.ip(), 40999), web).build();
    let r = dp.run(&new).expect("run");
    assert_eq!(
        r.packet, new,
        "a new flow to a removed service passes untouched"
    );
    // The flow's packets were counted under its service index (the counter array slot).
    let maps =
        lb_userspace::datapath::kernel::KernelMaps::open(&xlb_tests::pins(&dp.pins)).expect("maps");
    assert_eq!(
        maps.service_counter(id).packets,
        3,
        "SYN, later packet, reply"
    );
}

/// Runs `f` with this thread pinned to `cpu` (restoring its affinity after); `None` when
/// the machine has no such CPU.
fn on_cpu<T>(cpu: usize, f: impl FnOnce() -> T) -> Option<T> {
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
/// `XLB_BESTAT_V3`): a packet is counted in the row of the CPU that ran it, at
/// `cpu × stride + index`, and the readers (`xlb list`, metrics) sum the rows.
#[test]
fn counters_land_in_the_running_cpus_row_and_readers_sum_the_rows() {
    use aya::maps::{Array, MapData};
    use lb_common::{Counter, MAP_BACKEND_STATS, MAP_SVC_STATS};
    use lb_userspace::datapath::rows;

    let Some(mut dp) = setup() else {
        return;
    };
    let cpus = rows::cpus().expect("cpus") as usize;
    assert!(
        cpus >= 2,
        "this test needs two CPUs to tell the rows apart ({cpus} possible)"
    );
    let web = SocketAddrV4::new(VIP, 80);
    // One new flow on CPU 0, its next packet on CPU 1, another on CPU 1.
    let syn = PacketBuilder::tcp(CLIENT, web).build();
    let ack = PacketBuilder::tcp(CLIENT, web).flags(TCP_ACK).build();
    let r = on_cpu(0, || dp.run(&syn).expect("run")).expect("pin to CPU 0");
    let backend = parse(&r.packet).expect("parses").dst;
    for _ in 0..2 {
        on_cpu(1, || dp.run(&ack).expect("run")).expect("pin to CPU 1");
    }
    let pins = xlb_tests::pins(&dp.pins);
    let svc_id = lb_userspace::list::services(&pins)
        .expect("services")
        .iter()
        .find(|r| r.frontend == "10.96.0.10:80/TCP")
        .expect("web")
        .id;
    let backend_id = lb_userspace::list::backends(&pins)
        .expect("backends")
        .iter()
        .find(|b| b.backend.starts_with(&format!("{backend}/")))
        .expect("the chosen backend")
        .id;
    for (name, id) in [(MAP_SVC_STATS, svc_id), (MAP_BACKEND_STATS, backend_id)] {
        let array: Array<MapData, Counter> =
            Array::try_from(pins.map(name).expect("open")).expect("an array");
        let stride = array.len() / cpus as u32;
        let packets = |cpu: u32| array.get(&(cpu * stride + id), 0).expect("read").packets;
        assert_eq!(
            (packets(0), packets(1)),
            (1, 2),
            "{name}: index {id} in CPU 0's and CPU 1's rows (stride {stride})"
        );
        let mut summed = Counter::default();
        rows::sums(pins.get(name).expect("open"), name, |i, c| {
            if i == id {
                summed = c;
            }
        })
        .expect("sums");
        assert_eq!(summed.packets, 3, "{name}: the readers' sum of the rows");
    }
    let maps = lb_userspace::datapath::kernel::KernelMaps::open(&pins).expect("maps");
    assert_eq!(maps.service_counter(svc_id).packets, 3);
    assert_eq!(maps.backend_counter(backend_id).packets, 3);
}

/// An assured flow's packets wait in its conntrack entries (`CtValue::pending`) instead of
/// going to the counter rows one by one: `xlb list` adds them to the rows (the rows alone,
/// `KernelMaps::service_counter`, lag behind), and they reach the rows on the entry's
/// refresh (its first packet a second on), and with the flow's FIN.
#[test]
fn an_assured_flows_counts_wait_in_its_entries_until_a_refresh_or_its_fin() {
    use lb_userspace::{datapath::kernel::KernelMaps, list};

    const FIN: u8 = 0x01;
    let Some(mut dp) = setup() else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let syn = PacketBuilder::tcp(CLIENT, web).build();
    let r = dp.run(&syn).expect("run");
    let backend = parse(&r.packet).expect("parses").dst;
    let pins = xlb_tests::pins(&dp.pins);
    let svc_id = list::services(&pins)
        .expect("services")
        .iter()
        .find(|r| r.frontend == "10.96.0.10:80/TCP")
        .expect("web")
        .id;
    let backend_id = list::backends(&pins)
        .expect("backends")
        .iter()
        .find(|b| b.backend.starts_with(&format!("{backend}/")))
        .expect("the chosen backend")
        .id;
    let mut sent = (1u64, syn.len() as u64);
    let mut send = |dp: &mut LoadedDatapath, packet: Vec<u8>| {
        let r = dp.run(&packet).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
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
            "the backend's counts are the service's (one backend)"
        );
        ((s.packets, s.bytes), (svc.packets, svc.bytes))
    };
    let data = |flags| {
        PacketBuilder::tcp(CLIENT, web)
            .flags(flags)
            .payload(b"request")
            .build()
    };
    let answer = |flags| {
        PacketBuilder::tcp(backend, CLIENT)
            .flags(flags)
            .payload(b"answer")
            .build()
    };
    // Not assured yet: the SYN and the first answer go straight to the rows.
    let straight = send(&mut dp, answer(0x12));
    assert_eq!(counts(), (straight, straight));
    // Assured by the client's next packet: these wait in the entries, both ways.
    send(&mut dp, data(TCP_ACK));
    send(&mut dp, data(TCP_ACK));
    let all = send(&mut dp, answer(TCP_ACK));
    assert_eq!(
        counts(),
        (straight, all),
        "the rows have the flow's first two packets; `xlb list` all of them"
    );
    // A second on, the forward entry's next packet moves its pending counts to the rows
    // (and waits itself); the reply entry's wait on.
    std::thread::sleep(Duration::from_millis(1100));
    let before_refresh = all;
    let all = send(&mut dp, data(TCP_ACK));
    let answer_len = answer(TCP_ACK).len() as u64;
    assert_eq!(
        counts(),
        ((before_refresh.0 - 1, before_refresh.1 - answer_len), all),
        "refreshed: the forward entry's counts are in the rows, the answer's and this packet's wait"
    );
    // The FIN of each way moves its entry's counts (and itself) to the rows.
    send(&mut dp, data(TCP_ACK | FIN));
    let all = send(&mut dp, answer(TCP_ACK | FIN));
    assert_eq!(counts(), (all, all), "nothing waits after both FINs");
}

/// What two CPUs' flushes of one entry at the same moment leave in its pending counts (the
/// negation of what both took out) is taken out at the entry's next refresh without being
/// counted: the rows do not jump by hundreds of packets.
#[test]
fn a_negated_pending_count_is_cleared_without_counting() {
    use aya::maps::{HashMap, MapData};
    use lb_common::{CT_DIR_FORWARD, CtKey, CtValue, MAP_CT_ASSURED};
    use lb_userspace::datapath::kernel::KernelMaps;

    let Some(mut dp) = setup() else {
        return;
    };
    let web = SocketAddrV4::new(VIP, 80);
    let syn = PacketBuilder::tcp(CLIENT, web).build();
    let backend = parse(&dp.run(&syn).expect("run").packet)
        .expect("parses")
        .dst;
    let answer = PacketBuilder::tcp(backend, CLIENT).flags(0x12).build();
    let ack = PacketBuilder::tcp(CLIENT, web).flags(TCP_ACK).build();
    for p in [&answer, &ack] {
        assert_eq!(dp.run(p).expect("run").verdict, TC_ACT_OK);
    }
    let pins = xlb_tests::pins(&dp.pins);
    let mut assured: HashMap<MapData, CtKey, CtValue> =
        HashMap::try_from(pins.map(MAP_CT_ASSURED).expect("open")).expect("a hash");
    let (key, mut value) = assured
        .iter()
        .map(|e| e.expect("entry"))
        .find(|(k, _)| k.dir == CT_DIR_FORWARD)
        .expect("the assured forward entry");
    // Three packets of 60 B taken out twice: 0 - 3 packets - 180 B.
    value.pending = 0u32.wrapping_sub(3 * lb_common::CT_PENDING_PACKET + 180);
    value.last_seen_ns = 0;
    assured.insert(key, value, 0).expect("write");
    let svc_id = value.svc_id;
    let before = KernelMaps::open(&pins)
        .expect("maps")
        .service_counter(svc_id);
    // The refresh: the pending counts leave the entry; this packet waits in it.
    assert_eq!(dp.run(&ack).expect("run").verdict, TC_ACT_OK);
    let after = KernelMaps::open(&pins)
        .expect("maps")
        .service_counter(svc_id);
    assert_eq!(
        (after.packets, after.bytes),
        (before.packets, before.bytes),
        "the negation is not counted"
    );
    let (_, v) = assured
        .iter()
        .map(|e| e.expect("entry"))
        .find(|(k, _)| *k == key)
        .expect("still there");
    assert_eq!(
        lb_common::ct_pending(v.pending),
        (1, ack.len() as u32),
        "only the last packet waits"
    );
}
