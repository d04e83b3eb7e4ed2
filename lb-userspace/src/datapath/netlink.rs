//! One netlink request and its answer read to the end, for any netlink family's messages
//! (the rtnetlink rules and routes of `routing`, the ctnetlink flows of `kernel_ct`).

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::Socket;

/// Why an exchange failed.
#[derive(Debug)]
pub enum Failed {
    /// The socket.
    Io(std::io::Error),
    /// The kernel answered with an error.
    Kernel(std::io::Error),
    /// A message that did not parse.
    Decode(String),
}

impl From<Failed> for std::io::Error {
    fn from(f: Failed) -> Self {
        match f {
            Failed::Io(e) | Failed::Kernel(e) => e,
            Failed::Decode(e) => std::io::Error::other(e),
        }
    }
}

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

/// Sends `req` with the header `flags` and hands every message of the answer to `each`,
/// until the dump is done or the kernel acknowledges.
pub fn exchange<T>(sock: &Socket, flags: u16, req: T, mut each: impl FnMut(T)) -> Result<(), Failed>
where
    T: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
{
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    send(
        sock,
        NetlinkMessage::new(header, NetlinkPayload::InnerMessage(req)),
    )
    .map_err(Failed::Io)?;
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        let n = sock.recv(&mut buf, 0).map_err(Failed::Io)?;
        let mut off = 0;
        while off < n {
            let msg = NetlinkMessage::<T>::deserialize(&buf[off..n])
                .map_err(|e| Failed::Decode(e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(()),
                        Some(code) => Err(Failed::Kernel(std::io::Error::from_raw_os_error(
                            -code.get(),
                        ))),
                    };
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

/// [`exchange`] of the dump request `req`.
pub fn dump<T>(sock: &Socket, req: T, each: impl FnMut(T)) -> std::io::Result<()>
where
    T: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
{
    Ok(exchange(sock, NLM_F_REQUEST | NLM_F_DUMP, req, each)?)
}
