//! In a namespace that routes the pods: XDP redirects, SNAT to the node.

use super::*;

/// A namespace whose `dum0` (`fd00:10:245::1/64`, a veth, IPv6 forwarding on) routes
/// `prefixes` via `fd00:10:245::2`; with `neighbour`, dum0 has the MAC `02:00:00:00:00:01`
/// and that next hop is a permanent neighbour at `02:00:00:00:00:02` (XDP's route lookups
/// then resolve); with `mtu`, the veth has that MTU.
pub(super) fn routed_ns(
    tag: &str,
    prefixes: &[&str],
    neighbour: bool,
    mtu: Option<&str>,
) -> xlb_tests::netns::Netns {
    let ns = xlb_tests::netns::Netns::new(&format!("{tag}-n")).expect("netns");
    ns.sysctl(&[
        "net.ipv6.conf.all.forwarding=1",
        "net.ipv6.conf.default.forwarding=1",
    ])
    .expect("sysctl");
    let mut cmds: Vec<Vec<&str>> = vec![vec![
        "link", "add", "dum0", "type", "veth", "peer", "name", "dum1",
    ]];
    if let Some(mtu) = mtu {
        cmds.push(vec!["link", "set", "dum0", "mtu", mtu]);
    }
    if neighbour {
        cmds.push(vec!["link", "set", "dum0", "address", "02:00:00:00:00:01"]);
    }
    cmds.push(vec!["link", "set", "dum1", "up"]);
    cmds.push(vec!["link", "set", "dum0", "up"]);
    cmds.push(vec!["link", "set", "lo", "up"]);
    cmds.push(vec![
        "-6",
        "addr",
        "add",
        "fd00:10:245::1/64",
        "dev",
        "dum0",
        "nodad",
    ]);
    for p in prefixes {
        cmds.push(vec![
            "-6",
            "route",
            "add",
            p,
            "via",
            "fd00:10:245::2",
            "dev",
            "dum0",
        ]);
    }
    if neighbour {
        let mac = "02:00:00:00:00:02";
        let n = [
            "-6",
            "neigh",
            "add",
            "fd00:10:245::2",
            "lladdr",
            mac,
            "dev",
            "dum0",
        ];
        cmds.push(n.into_iter().chain(["nud", "permanent"]).collect());
    }
    for args in &cmds {
        ns.ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    }
    ns
}

const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

/// The XDP program on a node interface over IPv6, in a namespace whose route to the pods
/// goes through `dum0` to a known neighbour: a new flow and a reply are translated and
/// passed (the egress takes no XDP frames yet), then a new flow is redirected with the next
/// hop's MACs and the hop limit down by one; what XDP leaves to tc (ICMPv6, fragments, a frontend without
/// endpoints, a checksum still partial) passes untouched.
#[test]
fn xdp_translates_and_redirects_ipv6_flows() {
    if !require_root() {
        return;
    }
    let tag = unique_tag("xlp6x");
    let ns = routed_ns(&tag, &["fd00:10:244::/48"], true, None);
    ns.run(move || {
        let ifindex = lb_userspace::datapath::netif::ifindex("dum0").expect("dum0");
        let mut dp = loaded(&tag);
        let web = sa(VIP6, 80);
        let c = client(40700);
        let syn = Frame6::tcp(c, web, TCP_SYN, b"").build();
        let r = dp.run_xdp(&syn, ifindex).expect("run");
        assert_eq!(r.verdict, XDP_PASS, "new flow, egress without XDP: passed");
        let out = seen6(&r.packet, "new flow");
        assert!(BACKENDS6.contains(out.dst.ip()), "translated: {out:?}");
        assert_eq!((out.src, out.dst.port()), (c, 8080));
        let backend = out.dst;
        assert_eq!(reason_counts(&dp.pins)["new_flow"], 1);
        let reply = Frame6::tcp(backend, c, TCP_SYN | TCP_ACK, b"").build();
        let r = dp.run_xdp(&reply, ifindex).expect("run");
        assert_eq!(r.verdict, XDP_PASS);
        // Into the stack as netfilter sees it under kube-proxy (from the backend); tc egress
        // restores the frontend.
        assert_eq!(seen6(&r.packet, "reply").src, backend, "passed as sent");
        let r = dp.run_egress(&r.packet).expect("egress run");
        assert_eq!(
            seen6(&r.packet, "reply").src,
            web,
            "the reply from the frontend after tc egress"
        );
        dp.allow_xdp_redirect(ifindex).expect("devmap");
        // A new flow, now that the egress runs XDP: redirected, and so is its next packet.
        let c2 = client(40701);
        for (n, (what, flags)) in [("new flow", TCP_SYN), ("established", TCP_ACK)]
            .into_iter()
            .enumerate()
        {
            let r = dp
                .run_xdp(&Frame6::tcp(c2, web, flags, b"data").build(), ifindex)
                .expect("run");
            assert_eq!(
                r.verdict, XDP_REDIRECT,
                "{what}, egress runs XDP: redirected"
            );
            assert_eq!(
                &r.packet[0..6],
                &[2, 0, 0, 0, 0, 2],
                "{what}: next hop's MAC"
            );
            assert_eq!(&r.packet[6..12], &[2, 0, 0, 0, 0, 1], "{what}: egress MAC");
            assert_eq!(r.packet[21], 63, "{what}: hop limit down by one");
            let out = seen6(&r.packet, "redirected");
            assert!(BACKENDS6.contains(out.dst.ip()), "{what}: {out:?}");
            assert_eq!(reason_counts(&dp.pins)["xdp_redirect"], n as u64 + 1);
        }
        // The first flow's entry keeps the stack as its way out until its once-a-second
        // refresh: still passed, translated, with no route lookup.
        let ack = Frame6::tcp(c, web, TCP_ACK, b"data").build();
        let r = dp.run_xdp(&ack, ifindex).expect("run");
        assert_eq!(r.verdict, XDP_PASS, "established into the stack: passed");
        assert_eq!(seen6(&r.packet, "established").dst, backend);
        // Left to tc, untouched.
        let mut partial = Frame6::tcp(c, web, TCP_ACK, b"").build();
        let src = CLIENT6.ip().octets();
        let dst = VIP6.octets();
        let mut sum = frame6::sum16(&src, frame6::sum16(&dst, 0)) + 6 + 20;
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        partial[70..72].copy_from_slice(&(sum as u16).to_be_bytes());
        for (what, frame) in [
            (
                "an echo request",
                Frame6::icmp(*c.ip(), VIP6, 128, 0, [0, 1, 0, 1], b"ping").build(),
            ),
            (
                "a fragment",
                Frame6::tcp(c, web, TCP_SYN, b"")
                    .with_ext(Ext::fragment(0, true))
                    .build(),
            ),
            (
                "a frontend without endpoints",
                Frame6::tcp(c, sa(EMPTY6, 80), TCP_SYN, b"").build(),
            ),
            ("a checksum still partial", partial),
        ] {
            let r = dp.run_xdp(&frame, ifindex).expect("run");
            assert_eq!((r.verdict, &r.packet), (XDP_PASS, &frame), "{what}");
        }
    })
    .expect("namespace thread");
}

/// An IPv6 externalIP (externalTrafficPolicy Cluster) whose endpoint is on another node:
/// a client's flow is SNATed to the node's IPv6 address toward the backend (the route's
/// source) with a port of the SNAT range, and the backend's reply to that address comes
/// back from the externalIP to the client. In a namespace routing the pods and the client.
#[test]
fn ipv6_flows_to_a_remote_backend_of_an_external_frontend_are_snated_to_the_node() {
    if !require_root() {
        return;
    }
    let tag = unique_tag("xlp6s");
    let ns = routed_ns(&tag, &["fd00:10:244::/48", "2001:db8::/32"], false, None);
    ns.run(move || {
        let node6: Ipv6Addr = "fd00:10:245::1".parse().expect("address");
        let ext: Ipv6Addr = "2001:db8:100::5".parse().expect("address");
        let remote: Ipv6Addr = "fd00:10:244:9::2".parse().expect("address");
        let yaml = format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: ext6}}\nspec:\n  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n  clusterIP: \"fd00:10:96::20\"\n  clusterIPs: [\"fd00:10:96::20\"]\n  externalIPs: [\"{ext}\"]\n  ports:\n  - {{name: p, port: 80, protocol: TCP, targetPort: 8080}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: ext6-1\n  labels: {{kubernetes.io/service-name: ext6}}\naddressType: IPv6\nports:\n- {{name: p, port: 8080, protocol: TCP}}\nendpoints:\n- addresses: [\"{remote}\"]\n  conditions: {{ready: true}}\n  nodeName: node2\n"
        );
        let mut dp = LoadedDatapath::load(&tag).expect("load");
        dp.configure(&lb_common::NodeConfig {
            snat_port_min: 40000,
            snat_port_max: 40100,
            ..Default::default()
        })
        .expect("config");
        let loaded = lb_userspace::source::file::parse("ext6.yaml", &yaml).expect("yaml");
        assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
        dp.program_on(
            &loaded.model,
            &lb_userspace::desired::NodeContext::new("node1", &[], false),
        )
        .expect("program");
        let client = sa("2001:db8:1::7".parse().expect("address"), 5555);
        let frontend = sa(ext, 80);
        let syn = Frame6::tcp(client, frontend, TCP_SYN, b"").build();
        let r = dp.run(&syn).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK, "{:?}", reason_counts(&dp.pins));
        let out = seen6(&r.packet, "SNATed");
        assert_eq!(out.dst, sa(remote, 8080), "DNAT to the remote backend");
        assert_eq!(*out.src.ip(), node6, "SNAT to the node's address toward it");
        assert!((40000..=40100).contains(&out.src.port()), "{out:?}");
        let reply = Frame6::tcp(out.dst, out.src, TCP_SYN | TCP_ACK, b"").build();
        let r = dp.run(&reply).expect("run");
        assert_eq!(r.verdict, TC_ACT_OK);
        let back = seen6(&r.packet, "reply");
        assert_eq!((back.src, back.dst), (frontend, client), "back from the externalIP");
        // The next packet keeps its SNAT tuple.
        let ack = Frame6::tcp(client, frontend, TCP_ACK, b"x").build();
        let r = dp.run(&ack).expect("run");
        assert_eq!(seen6(&r.packet, "established").src, out.src);
        let flows = lb_userspace::list::conntrack(&xlb_tests::pins(&dp.pins)).expect("ct");
        assert!(
            flows.iter().any(|f| f.snat == format!("[{node6}]:{}", out.src.port())),
            "{flows:?}"
        );
        // A second client on the same port gets another SNAT port.
        let other = sa("2001:db8:1::8".parse().expect("address"), 5555);
        let r = dp
            .run(&Frame6::tcp(other, frontend, TCP_SYN, b"").build())
            .expect("run");
        let second = seen6(&r.packet, "second flow").src;
        assert_eq!(*second.ip(), node6);
        assert_ne!(second.port(), out.src.port(), "two flows never share a reply tuple");
    })
    .expect("namespace thread");
}
