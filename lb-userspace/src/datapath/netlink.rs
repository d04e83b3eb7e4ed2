//! A netlink request and a dump read to its end, for any netlink family's messages (the
//! rtnetlink rules and routes of `routing`, the sock_diag sockets of `stale`).

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::Socket;

/// Sends `msg` (its header finalized here).
pub fn send<T>(sock: &Socket, mut msg: NetlinkMessage<T>) -> std::io::Result<()>
where
    T: NetlinkSerializable + std::fmt::Debug,
{
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    sock.send(&buf, 0).map(|_| ())
}

/// Sends the dump request `req` and hands every message of its answer to `each`, until the
/// dump is done (`Err`: the socket failed, a message did not parse, or the kernel answered
/// with an error).
pub fn dump<T>(sock: &Socket, req: T, mut each: impl FnMut(T)) -> std::io::Result<()>
where
    T: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
{
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    send(
        sock,
        NetlinkMessage::new(header, NetlinkPayload::InnerMessage(req)),
    )?;
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        let n = sock.recv(&mut buf, 0)?;
        let mut off = 0;
        while off < n {
            let msg = NetlinkMessage::<T>::deserialize(&buf[off..n])
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return Err(std::io::Error::other(format!("netlink dump: {e:?}")));
                }
                NetlinkPayload::InnerMessage(m) => each(m),
                _ => {}
            }
            if len == 0 {
                break;
            }
            // Messages are aligned to 4 bytes.
            off += (len + 3) & !3;
        }
    }
}
