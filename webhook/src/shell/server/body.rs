//! A request body read under two bounds: its own size limit and deadline, and the room all bodies
//! in memory share (the body budget; the first [`FREE_BODY_BYTES`] of each body are free, so small
//! reviews never wait behind large or stalled ones).

use axum::body::Body;
use http_body_util::BodyExt;
use tokio::sync::Semaphore;

/// The first bytes of every body, read without asking the shared body budget: small reviews (a
/// pod is a few KiB) never wait behind large or stalled bodies.
pub const FREE_BODY_BYTES: usize = 64 * 1024;

/// Why a body was not read.
pub(super) enum BodyFailure {
    TooLarge,
    Read(String),
    /// The deadline passed while the client was sending.
    TimedOut,
    /// The deadline passed while waiting for room in the body budget.
    NoRoom,
}

/// Read the body into one buffer (sized from `Content-Length` when given), at most `limit`
/// bytes, before `deadline`; every byte past [`FREE_BODY_BYTES`] takes room in `budget` first.
/// Returns the body and the room it holds (released when dropped).
pub(super) async fn read_body<'a>(
    mut body: Body,
    declared: Option<u64>,
    limit: usize,
    budget: &'a Semaphore,
    deadline: tokio::time::Instant,
) -> Result<(Vec<u8>, Option<tokio::sync::SemaphorePermit<'a>>), BodyFailure> {
    let capacity = declared
        .and_then(|n| usize::try_from(n).ok())
        .map_or(FREE_BODY_BYTES.min(limit), |n| n.min(limit));
    let mut buf: Vec<u8> = Vec::with_capacity(capacity.min(FREE_BODY_BYTES));
    let mut room: Option<tokio::sync::SemaphorePermit<'a>> = None;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyFailure::TimedOut),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyFailure::Read(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let len = buf.len() + data.len();
        if len > limit {
            return Err(BodyFailure::TooLarge);
        }
        let counted =
            len.saturating_sub(FREE_BODY_BYTES) - buf.len().saturating_sub(FREE_BODY_BYTES);
        if counted > 0 {
            // `limit` fits the budget (see `ServerSettings::body_memory`) and a u32.
            let n = u32::try_from(counted).map_err(|_| BodyFailure::TooLarge)?;
            let more = match tokio::time::timeout_at(deadline, budget.acquire_many(n)).await {
                Ok(Ok(p)) => p,
                // The semaphore is never closed.
                Ok(Err(_)) | Err(_) => return Err(BodyFailure::NoRoom),
            };
            match &mut room {
                Some(r) => r.merge(more),
                None => room = Some(more),
            }
            if buf.capacity() < capacity {
                buf.reserve_exact(capacity - buf.len());
            }
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf, room))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use std::time::Duration;

    fn body(parts: &[usize]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = parts
            .iter()
            .map(|&n| Ok(Bytes::from(vec![b' '; n])))
            .collect();
        Body::from_stream(futures::stream::iter(chunks))
    }

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(50)
    }

    #[tokio::test]
    async fn bodies_take_room_past_the_free_bytes_and_give_it_back() {
        let budget = Semaphore::new(1000);
        // Within the free bytes: no room taken.
        let (b, room) = read_body(body(&[100, 200]), None, 1 << 20, &budget, soon())
            .await
            .ok()
            .unwrap();
        assert_eq!((b.len(), room.is_none()), (300, true));
        // 200 bytes past the free ones: held until the body is dropped.
        let parts = [FREE_BODY_BYTES - 100, 300];
        let (b, room) = read_body(
            body(&parts),
            Some(FREE_BODY_BYTES as u64 + 200),
            1 << 20,
            &budget,
            soon(),
        )
        .await
        .ok()
        .unwrap();
        assert_eq!(b.len(), FREE_BODY_BYTES + 200);
        assert_eq!(budget.available_permits(), 800);
        // A second body needing 900 finds no room before its deadline.
        let parts = [FREE_BODY_BYTES, 900];
        assert!(matches!(
            read_body(body(&parts), None, 1 << 20, &budget, soon()).await,
            Err(BodyFailure::NoRoom)
        ));
        drop(room);
        assert_eq!(budget.available_permits(), 1000);
        let (b, _room) = read_body(body(&parts), None, 1 << 20, &budget, soon())
            .await
            .ok()
            .unwrap();
        assert_eq!(b.len(), FREE_BODY_BYTES + 900);
        // Over the limit, however it arrives.
        assert!(matches!(
            read_body(body(&[10, 10]), None, 15, &budget, soon()).await,
            Err(BodyFailure::TooLarge)
        ));
    }
}
