//! E2B's cursor pagination, shared by the sandbox and snapshot listings: `limit` and
//! `nextToken` in the query, the next page's token in the `x-next-token` header. A token is
//! `<created ms>.<id>` of a page's last item, so pages stay stable while items come and go.

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::error::HttpError;

pub const MAX_PAGE: usize = 100;
const NEXT_TOKEN_HEADER: &str = "x-next-token";

/// Where a listed item sorts: its creation and its id, newest first unless ascending.
pub type Key = (i64, String);

pub fn key(created: DateTime<Utc>, id: &str) -> Key {
    (created.timestamp_millis(), id.to_string())
}

/// The page of `items` (already in listing order) after `nextToken`, at most `limit` long,
/// and the token of the page after it when there is one.
pub fn page<T>(
    mut items: Vec<T>,
    key_of: impl Fn(&T) -> Key,
    params: &[(String, String)],
    asc: bool,
) -> Result<(Vec<T>, Option<String>), HttpError> {
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let limit = match param("limit") {
        None => MAX_PAGE,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_PAGE).contains(l))
            .ok_or_else(|| HttpError::bad_request(format!("limit must be 1..={MAX_PAGE}")))?,
    };
    if let Some(token) = param("nextToken").filter(|t| !t.is_empty()) {
        let after = token
            .split_once('.')
            .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id.to_string())))
            .ok_or_else(|| HttpError::bad_request("invalid nextToken"))?;
        items.retain(|item| {
            let k = key_of(item);
            if asc {
                k > after
            } else {
                k < after
            }
        });
    }
    let more = items.len() > limit;
    items.truncate(limit);
    let next = more
        .then(|| items.last().map(&key_of))
        .flatten()
        .map(|(ms, id)| format!("{ms}.{id}"));
    Ok((items, next))
}

/// A JSON array answer carrying the next page's token.
pub fn response(items: Vec<Value>, next: Option<String>) -> Response {
    let mut resp = axum::Json(items).into_response();
    if let Some(v) = next.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert(NEXT_TOKEN_HEADER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pages_follow_the_token() {
        // Newest first: keys 5, 4, 3, 2, 1.
        let items: Vec<i64> = (1..=5).rev().collect();
        let key_of = |i: &i64| (*i, format!("id{i}"));
        let (first, next) = page(items.clone(), key_of, &q(&[("limit", "2")]), false).unwrap();
        assert_eq!(first, [5, 4]);
        let next = next.unwrap();
        assert_eq!(next, "4.id4");
        let (second, _) = page(
            items.clone(),
            key_of,
            &q(&[("limit", "2"), ("nextToken", &next)]),
            false,
        )
        .unwrap();
        assert_eq!(second, [3, 2]);
        let (last, none) = page(items, key_of, &q(&[("nextToken", "2.id2")]), false).unwrap();
        assert_eq!((last, none), (vec![1], None));
    }

    #[test]
    fn bad_limits_and_tokens_are_400() {
        for bad in [
            q(&[("limit", "0")]),
            q(&[("limit", "101")]),
            q(&[("nextToken", "x")]),
        ] {
            let e = page(
                vec![1],
                |i: &i32| (i64::from(*i), String::new()),
                &bad,
                false,
            )
            .unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
        }
    }
}
