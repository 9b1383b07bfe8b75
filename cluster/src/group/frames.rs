//! Reading one wire frame off the raft port with bounded memory and time.
//!
//! The buffer grows with the bytes that arrived, at most
//! [`FRAME_READ_CHUNK_BYTES`] ahead of them (doubling, so a large frame costs
//! few copies) and never past the frame's declared length: a peer that
//! declares 16 MiB and sends 4 KiB costs about 64 KiB, not 16 MiB. Once the
//! first byte of a frame arrives, the whole frame must arrive within the
//! read timeout, so a peer that dribbles a byte a second is dropped.

use bytes::BufMut;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// How much a read may ask for at once, and how far ahead of the bytes that
/// arrived the buffer may be reserved.
pub const FRAME_READ_CHUNK_BYTES: usize = 64 * 1024;

/// Bytes of a frame's length prefix.
const LEN_BYTES: usize = 4;

/// Why no frame was read.
#[derive(Debug, thiserror::Error)]
pub enum FrameReadError {
    #[error("frame read: {0}")]
    Io(#[from] std::io::Error),
    #[error("the connection closed inside a frame")]
    Truncated,
    #[error("a frame of {declared_bytes} bytes is over the {frame_bytes_max} byte limit")]
    TooLarge {
        declared_bytes: usize,
        frame_bytes_max: usize,
    },
    #[error("a frame of {declared_bytes} bytes is shorter than its {header_bytes} byte header")]
    TooShort {
        declared_bytes: usize,
        header_bytes: usize,
    },
    #[error("the frame did not arrive within {timeout_ms} ms of its first byte")]
    TimedOut { timeout_ms: u64 },
}

/// Reads one frame (its length prefix included) into `buf`, which must be
/// empty. `Ok(false)`: the peer closed the connection between frames. An
/// idle connection may wait for its next frame forever; from the frame's
/// first byte on, the rest must come within `read_timeout`.
pub async fn read_frame<R>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    header_bytes: usize,
    frame_bytes_max: usize,
    read_timeout: Duration,
) -> Result<bool, FrameReadError>
where
    R: AsyncRead + Unpin,
{
    debug_assert!(buf.is_empty());
    let mut first = [0u8; 1];
    if reader.read(&mut first).await? == 0 {
        return Ok(false);
    }
    let timeout_ms = u64::try_from(read_timeout.as_millis()).unwrap_or(u64::MAX);
    tokio::time::timeout(
        read_timeout,
        read_rest(reader, buf, first[0], header_bytes, frame_bytes_max),
    )
    .await
    .map_err(|_| FrameReadError::TimedOut { timeout_ms })??;
    Ok(true)
}

async fn read_rest<R>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    first: u8,
    header_bytes: usize,
    frame_bytes_max: usize,
) -> Result<(), FrameReadError>
where
    R: AsyncRead + Unpin,
{
    let mut len = [first, 0, 0, 0];
    reader
        .read_exact(&mut len[1..])
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => FrameReadError::Truncated,
            _ => FrameReadError::Io(e),
        })?;
    let declared = u32::from_be_bytes(len) as usize;
    if declared > frame_bytes_max {
        return Err(FrameReadError::TooLarge {
            declared_bytes: declared,
            frame_bytes_max,
        });
    }
    if declared < header_bytes {
        return Err(FrameReadError::TooShort {
            declared_bytes: declared,
            header_bytes,
        });
    }
    let total = LEN_BYTES + declared;
    buf.reserve_exact(total.min(LEN_BYTES + FRAME_READ_CHUNK_BYTES));
    buf.extend_from_slice(&len);
    while buf.len() < total {
        if buf.capacity() == buf.len() {
            // Full: double what arrived (at least a chunk more), never past
            // the frame's length.
            let target = (buf.capacity() * 2)
                .max(buf.len() + FRAME_READ_CHUNK_BYTES)
                .min(total);
            buf.reserve_exact(target - buf.len());
        }
        let want = (total - buf.len())
            .min(FRAME_READ_CHUNK_BYTES)
            .min(buf.capacity() - buf.len());
        // Into the spare capacity just ensured: no allocation, and a read
        // cut short by the timeout leaves `buf` holding exactly what came.
        let mut spare = (&mut *buf).limit(want);
        let n = reader.read_buf(&mut spare).await?;
        if n == 0 {
            return Err(FrameReadError::Truncated);
        }
    }
    Ok(())
}
