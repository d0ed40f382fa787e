//! A websocket frame's header, read in place from the bytes that carry it
//! (RFC 6455 §5.2). The relay reads the header of every frame it forwards;
//! tungstenite's `FrameHeader::parse` reads through `std::io::Read` on a
//! `Cursor`, one copy per field and its large error type moved back out,
//! about a sixth of the relay's own instructions per echo (see
//! docs/benchmarks.md, session 31).

use tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode;

/// What a frame's header says; nothing in it is checked yet (the relay
/// checks it against RFC 6455 §5 before it passes the frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Head {
    /// FIN: the last frame of its message.
    pub(super) fin: bool,
    /// RSV1, RSV2 and RSV3, in place in the first byte (0x70): zero unless
    /// an extension was agreed, and the relay agrees to none.
    pub(super) reserved: u8,
    pub(super) opcode: OpCode,
    /// The masking key: a client's frames carry one, a server's do not.
    pub(super) mask: Option<[u8; 4]>,
    /// The payload's length.
    pub(super) length: u64,
    /// The header's own length, 2 to 14 bytes.
    pub(super) size: usize,
}

impl Head {
    /// The header at the start of `bytes`, or `None` while some of it has
    /// not arrived.
    pub(super) fn parse(bytes: &[u8]) -> Option<Head> {
        let [first, second, rest @ ..] = bytes else {
            return None;
        };
        // A 7-bit length, or 126 and 16 bits, or 127 and 64 bits, in
        // network byte order.
        let (length, rest, size) = match second & 0x7f {
            126 => {
                let (bytes, rest) = rest.split_first_chunk::<2>()?;
                (u64::from(u16::from_be_bytes(*bytes)), rest, 4)
            }
            127 => {
                let (bytes, rest) = rest.split_first_chunk::<8>()?;
                (u64::from_be_bytes(*bytes), rest, 10)
            }
            short => (u64::from(short), rest, 2),
        };
        let (mask, size) = if second & 0x80 != 0 {
            let (key, _) = rest.split_first_chunk::<4>()?;
            (Some(*key), size + 4)
        } else {
            (None, size)
        };
        Some(Head {
            fin: first & 0x80 != 0,
            reserved: first & 0x70,
            opcode: OpCode::from(first & 0x0f),
            mask,
            length,
            size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data};
    use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;

    /// Every length format at its edges, masked or not, each valid opcode,
    /// FIN and the reserved bits: the same header tungstenite reads (it
    /// writes them too), and `None` for every prefix cut short.
    #[test]
    fn reads_what_tungstenite_writes_and_waits_for_the_rest() {
        let opcodes = [
            OpCode::Data(Data::Continue),
            OpCode::Data(Data::Text),
            OpCode::Data(Data::Binary),
            OpCode::Control(Control::Close),
            OpCode::Control(Control::Ping),
            OpCode::Control(Control::Pong),
        ];
        let lengths = [0, 1, 125, 126, 127, 65_535, 65_536, 1 << 40];
        let mut checked = 0;
        for opcode in opcodes {
            for length in lengths {
                for mask in [None, Some([9, 8, 7, 6])] {
                    for bits in 0..16u8 {
                        let header = FrameHeader {
                            is_final: bits & 8 != 0,
                            rsv1: bits & 4 != 0,
                            rsv2: bits & 2 != 0,
                            rsv3: bits & 1 != 0,
                            opcode,
                            mask,
                        };
                        let mut bytes = Vec::new();
                        header.format(length, &mut bytes).expect("format");
                        // A payload's first bytes follow the header.
                        bytes.extend_from_slice(b"payload");
                        let (theirs, their_length) = FrameHeader::parse(&mut Cursor::new(&bytes))
                            .expect("tungstenite reads it")
                            .expect("whole");
                        let ours = Head::parse(&bytes).expect("whole");
                        assert_eq!(ours.fin, theirs.is_final);
                        assert_eq!(ours.reserved & 0x40 != 0, theirs.rsv1);
                        assert_eq!(ours.reserved & 0x20 != 0, theirs.rsv2);
                        assert_eq!(ours.reserved & 0x10 != 0, theirs.rsv3);
                        assert_eq!(ours.opcode, theirs.opcode);
                        assert_eq!(ours.mask, theirs.mask);
                        assert_eq!(ours.length, their_length);
                        assert_eq!(ours.size, bytes.len() - b"payload".len());
                        for cut in 0..ours.size {
                            assert_eq!(Head::parse(&bytes[..cut]), None, "{cut} of {bytes:?}");
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 6 * 8 * 2 * 16);
    }

    /// Reserved opcodes are read, not refused here: the relay refuses them
    /// with its other checks.
    #[test]
    fn reserved_opcodes_are_read_as_such() {
        for (byte, opcode) in [
            (0x83, OpCode::Data(Data::Reserved(3))),
            (0x8b, OpCode::Control(Control::Reserved(11))),
        ] {
            let head = Head::parse(&[byte, 0x00]).expect("whole");
            assert_eq!(head.opcode, opcode);
            assert_eq!((head.length, head.size, head.mask), (0, 2, None));
        }
    }
}
