//! Framing: a 4-byte big-endian length, then a postcard-encoded [`Frame`].
//!
//! The length prefix is checked against [`MAX_FRAME_BYTES`] before anything is allocated, and a
//! frame that does not decode is an error that ends the connection.

use std::marker::PhantomData;

use bytes::BytesMut;
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
        match self.inner.decode(src)? {
            Some(bytes) => Ok(Some(postcard::from_bytes(&bytes)?)),
            None => Ok(None),
        }
    }
}

impl<In, Out: Serialize> Encoder<Frame<Out>> for FrameCodec<In, Out> {
    type Error = CodecError;

    fn encode(&mut self, frame: Frame<Out>, dst: &mut BytesMut) -> Result<(), CodecError> {
        let bytes = postcard::to_allocvec(&frame)?;
        if bytes.len() > MAX_FRAME_BYTES {
            return Err(CodecError::TooLarge(bytes.len()));
        }
        self.inner.encode(bytes::Bytes::from(bytes), dst)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ExecRequest, FromAgent, ToAgent};
    use bytes::BufMut;

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
}
