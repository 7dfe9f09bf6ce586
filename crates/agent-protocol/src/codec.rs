//! Framing: a 4-byte big-endian length, then a postcard-encoded [`Frame`].
//!
//! The length prefix is checked against [`MAX_FRAME_BYTES`] before anything is allocated, and a
//! frame that does not decode is an error that ends the connection.

use std::marker::PhantomData;

use bytes::{BufMut, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::messages::{Frame, MAX_FRAME_BYTES};

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("agent connection I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed frame: {0}")]
    Malformed(#[from] postcard::Error),
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
}

/// Bytes of the length prefix.
const LEN_BYTES: usize = 4;

/// Encodes `Frame<Out>` and decodes `Frame<In>`.
pub struct FrameCodec<In, Out> {
    inner: LengthDelimitedCodec,
    _marker: PhantomData<fn(Out) -> In>,
}

impl<In, Out> Default for FrameCodec<In, Out> {
    fn default() -> Self {
        Self {
            inner: LengthDelimitedCodec::builder()
                .max_frame_length(MAX_FRAME_BYTES)
                .new_codec(),
            _marker: PhantomData,
        }
    }
}

impl<In: DeserializeOwned, Out> Decoder for FrameCodec<In, Out> {
    type Item = Frame<In>;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame<In>>, CodecError> {
        // The frame is split off `src`, not copied; postcard then copies only what the owned
        // message keeps.
        match self.inner.decode(src)? {
            Some(bytes) => Ok(Some(postcard::from_bytes(&bytes)?)),
            None => Ok(None),
        }
    }
}

impl<In, Out: Serialize> Encoder<Frame<Out>> for FrameCodec<In, Out> {
    type Error = CodecError;

    /// Serialises straight into `dst` behind a length prefix filled in afterwards (the
    /// format `LengthDelimitedCodec` decodes): no buffer of its own, no copy. A frame over the
    /// limit (or one that fails to serialise) leaves `dst` as it was.
    fn encode(&mut self, frame: Frame<Out>, dst: &mut BytesMut) -> Result<(), CodecError> {
        let start = dst.len();
        dst.put_u32(0);
        let written = postcard::to_io(&frame, dst.writer()).map(drop);
        let len = dst.len() - start - LEN_BYTES;
        let checked = written.map_err(CodecError::from).and_then(|()| {
            u32::try_from(len)
                .ok()
                .filter(|_| len <= MAX_FRAME_BYTES)
                .ok_or(CodecError::TooLarge(len))
        });
        match checked {
            Ok(prefix) => {
                dst[start..start + LEN_BYTES].copy_from_slice(&prefix.to_be_bytes());
                Ok(())
            }
            Err(e) => {
                dst.truncate(start);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ExecRequest, FromAgent, ToAgent, TraceContext};

    type AgentSide = FrameCodec<ToAgent, FromAgent>;

    #[test]
    fn round_trip() {
        let mut daemon = FrameCodec::<FromAgent, ToAgent>::default();
        let mut agent = AgentSide::default();
        let mut buf = BytesMut::new();
        let frame = Frame {
            stream: 7,
            msg: ToAgent::Exec(ExecRequest {
                argv: vec!["echo".into(), "héllo".into()],
                stdin: vec![0, 255, 10],
                trace: Some(TraceContext {
                    trace_id: [7; 16],
                    span_id: [9; 8],
                    sampled: true,
                }),
                ..Default::default()
            }),
        };
        daemon.encode(frame.clone(), &mut buf).unwrap();
        assert_eq!(agent.decode(&mut buf).unwrap(), Some(frame));
        assert!(buf.is_empty());
    }

    #[test]
    fn partial_frame_waits_for_more() {
        let mut daemon = FrameCodec::<FromAgent, ToAgent>::default();
        let mut full = BytesMut::new();
        daemon
            .encode(
                Frame {
                    stream: 1,
                    msg: ToAgent::Health,
                },
                &mut full,
            )
            .unwrap();
        let mut agent = AgentSide::default();
        let mut part = BytesMut::from(&full[..full.len() - 1]);
        assert_eq!(agent.decode(&mut part).unwrap(), None);
        part.extend_from_slice(&full[full.len() - 1..]);
        assert!(agent.decode(&mut part).unwrap().is_some());
    }

    #[test]
    fn huge_length_prefix_is_refused_without_allocating() {
        let mut agent = AgentSide::default();
        let mut buf = BytesMut::new();
        buf.put_u32(u32::MAX);
        buf.put_slice(&[0; 16]);
        assert!(matches!(agent.decode(&mut buf), Err(CodecError::Io(_))));
    }

    #[test]
    fn garbage_payload_is_malformed() {
        let mut agent = AgentSide::default();
        let mut buf = BytesMut::new();
        buf.put_u32(3);
        buf.put_slice(&[0x01, 0xff, 0xff]);
        assert!(matches!(
            agent.decode(&mut buf),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn oversized_outgoing_frame_is_refused() {
        let mut agent = AgentSide::default();
        let mut buf = BytesMut::new();
        let frame = Frame {
            stream: 1,
            msg: FromAgent::Stdout(vec![b'x'; MAX_FRAME_BYTES + 1]),
        };
        assert!(matches!(
            agent.encode(frame, &mut buf),
            Err(CodecError::TooLarge(_))
        ));
        assert!(buf.is_empty());
    }

    /// The frames this codec writes are exactly what a plain length-delimited reader expects,
    /// appended after whatever `dst` held; one over the limit leaves what was there untouched.
    #[test]
    fn encoded_frames_are_length_delimited_and_appended() {
        let mut agent = AgentSide::default();
        let mut buf = BytesMut::from(&b"kept"[..]);
        let frames = [
            Frame {
                stream: 3,
                msg: FromAgent::Stdout(vec![7; 100_000]),
            },
            Frame {
                stream: u64::MAX,
                msg: FromAgent::Started { pid: 42 },
            },
        ];
        for f in &frames {
            agent.encode(f.clone(), &mut buf).unwrap();
        }
        let too_big = Frame {
            stream: 1,
            msg: FromAgent::Stdout(vec![0; MAX_FRAME_BYTES]),
        };
        let before = buf.clone();
        assert!(matches!(
            agent.encode(too_big, &mut buf),
            Err(CodecError::TooLarge(n)) if n > MAX_FRAME_BYTES
        ));
        assert_eq!(buf, before);

        assert_eq!(&buf.split_to(4)[..], b"kept");
        let mut plain = LengthDelimitedCodec::new();
        for f in &frames {
            let payload = plain.decode(&mut buf).unwrap().unwrap();
            assert_eq!(payload, postcard::to_allocvec(f).unwrap());
        }
        assert!(buf.is_empty());
    }

    /// A frame of exactly the limit passes both ways; the decoder refuses one byte more.
    #[test]
    fn the_limit_is_the_same_on_both_sides() {
        let fits = |n: usize| Frame {
            stream: 1,
            msg: FromAgent::Stdout(vec![1; n]),
        };
        let overhead = postcard::to_allocvec(&fits(0)).unwrap().len();
        // The length of a 1 MiB vector takes two bytes more than an empty one's.
        let exact = fits(MAX_FRAME_BYTES - overhead - 2);
        assert_eq!(
            postcard::to_allocvec(&exact).unwrap().len(),
            MAX_FRAME_BYTES
        );
        let mut agent = AgentSide::default();
        let mut buf = BytesMut::new();
        agent.encode(exact.clone(), &mut buf).unwrap();
        let mut daemon = FrameCodec::<FromAgent, ToAgent>::default();
        assert_eq!(daemon.decode(&mut buf).unwrap(), Some(exact));

        let mut buf = BytesMut::new();
        buf.put_u32(MAX_FRAME_BYTES as u32 + 1);
        buf.put_slice(&[0; 64]);
        assert!(matches!(daemon.decode(&mut buf), Err(CodecError::Io(_))));
    }

    #[test]
    fn truncated_payload_is_malformed() {
        let full = postcard::to_allocvec(&Frame {
            stream: 9,
            msg: ToAgent::Exec(ExecRequest {
                argv: vec!["/bin/true".into()],
                ..Default::default()
            }),
        })
        .unwrap();
        // A length prefix that cuts the message short: the frame is complete, its content not.
        let mut buf = BytesMut::new();
        buf.put_u32(full.len() as u32 - 3);
        buf.put_slice(&full[..full.len() - 3]);
        let mut agent = AgentSide::default();
        assert!(matches!(
            agent.decode(&mut buf),
            Err(CodecError::Malformed(_))
        ));
    }
}
