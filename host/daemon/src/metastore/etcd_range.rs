//! Reading every key under a prefix from etcd, in pages, as of one revision.
//!
//! One range answer holding all of a large cluster's metadata does not fit a gRPC message as
//! the client takes it by default (4 MiB; 20,000 topics of 12 partitions are about 10 MB), and
//! makes etcd build the whole answer in memory at once. So a prefix is read [`PAGE_KEYS`] keys
//! at a time, every page after the first pinned to the first page's revision: together they
//! are one consistent read, as a single range would be. A page holds at most [`PAGE_KEYS`]
//! items of at most one etcd request each, so it always fits [`MAX_ANSWER_BYTES`].

use etcd_client::{Client, GetOptions, KeyValue};

/// Keys per page of a prefix read.
pub const PAGE_KEYS: i64 = 128;

/// Largest answer (a page, or a batch of watch events) the etcd clients here accept: a page of
/// [`PAGE_KEYS`] values of the largest request etcd takes by default (1.5 MiB) fits.
pub const MAX_ANSWER_BYTES: usize = 256 << 20;

/// Pages read again from the start when etcd compacted the revision between two of them.
const COMPACTED_RETRIES: usize = 3;

/// Every key under a prefix with its value, as of `revision`.
pub struct PrefixRead {
    /// The etcd revision the read reflects (the first page's header revision).
    pub revision: i64,
    /// The keys in key order, the prefix not stripped.
    pub kvs: Vec<KeyValue>,
}

/// The end of the range holding every key that starts with `prefix`: the prefix with its last
/// byte below 0xff raised by one (the bytes after it dropped); `\0` (to the end of the key
/// space) when every byte is 0xff.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Reads every key under `prefix` in pages of [`PAGE_KEYS`], all at one revision;
/// linearizable unless `serializable` (then from the member this client talks to, which may
/// lag the leader). `keys_only` leaves the values out.
pub async fn read_prefix(
    client: &Client,
    prefix: &str,
    serializable: bool,
    keys_only: bool,
) -> Result<PrefixRead, etcd_client::Error> {
    let mut attempt = 0;
    loop {
        match read_pages(client, prefix, serializable, keys_only).await {
            Err(e) if attempt < COMPACTED_RETRIES && e.to_string().contains("compacted") => {
                // The revision of the first page was compacted before a later one was read.
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn read_pages(
    client: &Client,
    prefix: &str,
    serializable: bool,
    keys_only: bool,
) -> Result<PrefixRead, etcd_client::Error> {
    let mut kv = client
        .kv_client()
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    let end = prefix_end(prefix.as_bytes());
    let mut start = prefix.as_bytes().to_vec();
    let mut revision = 0;
    let mut kvs = Vec::new();
    loop {
        let mut options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(PAGE_KEYS);
        if serializable {
            options = options.with_serializable();
        }
        if keys_only {
            options = options.with_keys_only();
        }
        if revision > 0 {
            options = options.with_revision(revision);
        }
        let mut page = kv.get(start.clone(), Some(options)).await?;
        if revision == 0 {
            revision = page.header().map_or(0, |h| h.revision());
        }
        let more = page.more();
        let got = page.take_kvs();
        // The next page starts just after this one's last key.
        let next = got.last().map(|last| {
            let mut key = last.key().to_vec();
            key.push(0);
            key
        });
        kvs.extend(got);
        match next {
            Some(next) if more => start = next,
            _ => return Ok(PrefixRead { revision, kvs }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::test_etcd::TestEtcd;

    #[test]
    fn the_end_of_a_prefix_range_is_the_prefix_raised_by_one() {
        assert_eq!(prefix_end(b"/narad/a/meta/"), b"/narad/a/meta0".to_vec());
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    /// Many pages, at one revision: a write landing between two pages is not in the read.
    #[tokio::test]
    async fn a_prefix_of_many_pages_reads_whole_in_order_at_the_first_pages_revision() {
        let etcd = TestEtcd::start();
        let client = Client::connect([etcd.endpoint()], None)
            .await
            .expect("etcd");
        let mut kv = client.kv_client();
        let count = PAGE_KEYS as usize * 3 + 7;
        for i in 0..count {
            kv.put(format!("/p/k{i:05}"), vec![b'v'; 10], None)
                .await
                .expect("put");
        }
        // Keys just outside the prefix on both sides stay out.
        kv.put("/p", "no", None).await.expect("put");
        kv.put("/p0", "no", None).await.expect("put");
        let read = read_prefix(&client, "/p/", false, false)
            .await
            .expect("read");
        let keys: Vec<String> = read
            .kvs
            .iter()
            .map(|kv| String::from_utf8(kv.key().to_vec()).expect("utf-8"))
            .collect();
        let expected: Vec<String> = (0..count).map(|i| format!("/p/k{i:05}")).collect();
        assert_eq!(keys, expected);

        let old = read.revision;
        kv.put("/p/k00000", "changed", None).await.expect("put");
        let keys_only = read_prefix(&client, "/p/", true, true).await.expect("read");
        assert_eq!(keys_only.kvs.len(), count);
        assert!(keys_only.kvs.iter().all(|kv| kv.value().is_empty()));
        assert!(keys_only.revision > old);
    }
}
