//! Round trips between the host-side encoder and the guest-side reader, byte compatibility of
//! the hand-written context codec with postcard, the manifest JSON, and hostile input.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use narad_abi::layout::{
    ENTRY_LEN_BYTES, HEADER_LEN_BYTES, KEY_HASH_HEADER_LEN_BYTES, KEY_HASH_PRESENT, MAGIC, entry,
    header,
};
use narad_abi::{
    EncodeError, Field, LayoutError, Manifest, Needs, RecordInput, Region, RouteContext,
    RouteContextRef, SlabEncoder, SlabView, murmur2, partition_for_hash, partition_for_key,
};
use proptest::prelude::*;

fn context() -> RouteContext {
    RouteContext {
        parent_topic: "orders".into(),
        parent_partition: 2,
        parent_partition_count: 4,
        child_topic: "analytics".into(),
        child_partition_count: 8,
        attempt: 1,
        config: b"header=region\nus=0\n".to_vec(),
    }
}

const HEADERS: &[(&[u8], &[u8])] = &[(b"region", b"eu"), (b"trace", b"")];

fn records() -> Vec<RecordInput<'static>> {
    vec![
        RecordInput {
            parent_offset: 10,
            committed_at_ms: 1_700_000_000_000,
            key: Some(b"user-1"),
            headers: HEADERS,
            value: b"hello",
        },
        RecordInput {
            parent_offset: 11,
            committed_at_ms: -5,
            key: None,
            headers: &[],
            value: b"",
        },
        RecordInput {
            parent_offset: u64::MAX,
            committed_at_ms: i64::MAX,
            key: Some(b""),
            headers: &[],
            value: b"v",
        },
    ]
}

#[test]
fn keys_only_slab_round_trips_without_copying_headers_or_values() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::KEYS).unwrap();
    let recs = records();
    let buf = enc.encode_to_vec(&recs).unwrap();
    let view = SlabView::parse(&buf).unwrap();
    assert_eq!(view.len(), 3);
    assert_eq!(view.context().unwrap(), ctx.as_ref());
    let keys: Vec<_> = view.records().map(|r| r.key().unwrap()).collect();
    assert_eq!(keys, vec![Some(&b"user-1"[..]), None, Some(&b""[..])]);
    // Only the keys are in the arena: 6 + 0 bytes.
    let arena_len = u32::from_le_bytes(buf[header::ARENA_LEN..][..4].try_into().unwrap());
    assert_eq!(arena_len, 6);
    let r = view.record(0).unwrap();
    assert_eq!(
        r.value(),
        Err(LayoutError::NotRequested {
            field: Field::Value
        })
    );
    assert!(matches!(
        r.headers(),
        Err(LayoutError::NotRequested {
            field: Field::Headers
        })
    ));
}

#[test]
fn full_slab_round_trips_every_field() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::ALL).unwrap();
    let recs = records();
    let buf = enc.encode_to_vec(&recs).unwrap();
    let view = SlabView::parse(&buf).unwrap();
    assert_eq!(view.needs(), Needs::ALL);
    for (r, want) in view.records().zip(&recs) {
        assert_eq!(r.parent_offset(), want.parent_offset);
        assert_eq!(r.committed_at_ms(), want.committed_at_ms);
        assert_eq!(r.key().unwrap(), want.key);
        assert_eq!(r.has_key(), want.key.is_some());
        assert_eq!(r.value().unwrap(), want.value);
        let headers: Vec<_> = r
            .headers()
            .unwrap()
            .map(|h| {
                let h = h.unwrap();
                (h.name.as_bytes(), h.value)
            })
            .collect();
        assert_eq!(headers, want.headers.to_vec());
    }
    assert_eq!(
        view.record(0).unwrap().header("region").unwrap(),
        Some(&b"eu"[..])
    );
    assert_eq!(view.record(0).unwrap().header("absent").unwrap(), None);
    assert_eq!(
        view.record(3).unwrap_err(),
        LayoutError::RecordOutOfRange { index: 3, count: 3 }
    );
}

#[test]
fn the_table_is_eight_aligned_and_padding_is_zeroed() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::KEYS).unwrap();
    let recs = records();
    let layout = enc.layout(&recs).unwrap();
    // Dirty memory, as guest memory may be.
    let mut buf = vec![0xAA; layout.total_len() + 7];
    let n = enc.write(&layout, &recs, &mut buf).unwrap();
    assert_eq!(n, layout.total_len());
    assert_eq!(&buf[..4], &MAGIC);
    let ctx_len = u32::from_le_bytes(buf[header::CONTEXT_LEN..][..4].try_into().unwrap()) as usize;
    let table = u32::from_le_bytes(buf[header::TABLE_OFFSET..][..4].try_into().unwrap()) as usize;
    assert_eq!(table % 8, 0);
    assert!(
        buf[HEADER_LEN_BYTES + ctx_len..table]
            .iter()
            .all(|&b| b == 0)
    );
    // A keyless record has offset 0 and the no-key length.
    let e1 = table + ENTRY_LEN_BYTES;
    assert_eq!(&buf[e1 + entry::KEY_OFFSET..][..4], &0u32.to_le_bytes());
    assert_eq!(&buf[e1 + entry::KEY_LEN..][..4], &u32::MAX.to_le_bytes());
    assert_eq!(&buf[e1 + entry::VALUE_OFFSET..][..8], &[0; 8]);
}

#[test]
fn writing_other_records_than_were_measured_is_refused() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::ALL).unwrap();
    let recs = records();
    let layout = enc.layout(&recs).unwrap();
    let mut buf = vec![0; layout.total_len()];
    assert_eq!(
        enc.write(&layout, &recs[..2], &mut buf),
        Err(EncodeError::LayoutMismatch)
    );
    let mut longer = recs.clone();
    longer[0].key = Some(b"a-longer-key");
    assert_eq!(
        enc.write(&layout, &longer, &mut buf),
        Err(EncodeError::LayoutMismatch)
    );
    assert_eq!(
        enc.write(&layout, &recs, &mut buf[..10]),
        Err(EncodeError::BufferTooSmall {
            needed: layout.total_len(),
            got: 10
        })
    );
}

#[test]
fn an_empty_slab_is_valid() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::KEYS).unwrap();
    let buf = enc.encode_to_vec(Vec::<RecordInput>::new()).unwrap();
    let view = SlabView::parse(&buf).unwrap();
    assert!(view.is_empty());
    assert_eq!(view.records().count(), 0);
}

#[test]
fn hand_written_context_codec_matches_postcard() {
    let ctx = context();
    let ours = SlabEncoder::new(ctx.as_ref(), Needs::KEYS)
        .unwrap()
        .encode_to_vec(Vec::<RecordInput>::new())
        .unwrap();
    let view = SlabView::parse(&ours).unwrap();
    assert_eq!(view.context_bytes(), postcard::to_allocvec(&ctx).unwrap());
    let back: RouteContext = postcard::from_bytes(view.context_bytes()).unwrap();
    assert_eq!(back, ctx);
}

#[test]
fn bad_header_fields_are_typed_errors() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::KEYS).unwrap();
    let good = enc.encode_to_vec(&records()).unwrap();

    assert_eq!(
        SlabView::parse(&good[..31]).unwrap_err(),
        LayoutError::TooShort { len: 31 }
    );

    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(
        SlabView::parse(&bad),
        Err(LayoutError::BadMagic { .. })
    ));

    // An unknown bit, and a word with neither the key bytes nor the key hashes.
    for bits in [16u32 | 1, Needs::HEADERS_BIT] {
        let mut bad = good.clone();
        bad[header::FIELDS..][..4].copy_from_slice(&bits.to_le_bytes());
        assert_eq!(
            SlabView::parse(&bad).unwrap_err(),
            LayoutError::BadFields { bits }
        );
    }

    let mut bad = good.clone();
    bad[header::RECORD_COUNT..][..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        SlabView::parse(&bad),
        Err(LayoutError::RegionOutOfBounds {
            region: Region::Table,
            ..
        })
    ));

    // Truncating the buffer cuts the arena off.
    assert!(matches!(
        SlabView::parse(&good[..good.len() - 1]),
        Err(LayoutError::RegionOutOfBounds {
            region: Region::Arena,
            ..
        })
    ));
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..][..4].try_into().unwrap())
}

/// [`records`] encoded for `needs` into memory full of `0xAA`, as guest memory may be: every
/// byte a reader looks at must still be written. Checks the header's needs and context.
fn encoded_on_dirty_memory(needs: Needs) -> Vec<u8> {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), needs).unwrap();
    let recs = records();
    let layout = enc.layout(&recs).unwrap();
    let mut buf = vec![0xAA; layout.total_len()];
    enc.write(&layout, &recs, &mut buf).unwrap();
    let view = SlabView::parse(&buf).unwrap();
    assert_eq!(view.needs(), needs);
    assert_eq!(view.context().unwrap(), ctx.as_ref());
    buf
}

/// The key hashes of [`records`], in order.
fn records_key_hashes() -> Vec<Option<u32>> {
    vec![
        Some(murmur2(b"user-1") as u32),
        None,
        Some(murmur2(b"") as u32),
    ]
}

#[test]
fn key_hashes_alone_give_each_keyed_record_its_murmur2_and_copy_no_key_bytes() {
    let buf = encoded_on_dirty_memory(Needs::KEY_HASH);
    let view = SlabView::parse(&buf).unwrap();
    let hashes: Vec<_> = view.records().map(|r| r.key_hash().unwrap()).collect();
    assert_eq!(hashes, records_key_hashes());
    assert_eq!(
        view.record(2).unwrap().key_hash(),
        Ok(Some(murmur2(b"") as u32))
    );
    // Presence is still known, but the bytes are not there.
    let present: Vec<_> = view.records().map(|r| r.has_key()).collect();
    assert_eq!(present, [true, false, true]);
    assert_eq!(
        view.record(0).unwrap().key(),
        Err(LayoutError::NotRequested { field: Field::Key })
    );
    assert_eq!(view.record(1).unwrap().key(), Ok(None));
    assert_eq!(u32_at(&buf, header::ARENA_LEN), 0);
    // The layout: a 36-byte header, the table, then n u64 entries (hash, presence bit 32; 0
    // for the keyless record), then the (empty) arena.
    assert_eq!(
        u32_at(&buf, header::CONTEXT_OFFSET) as usize,
        KEY_HASH_HEADER_LEN_BYTES
    );
    let table = u32_at(&buf, header::TABLE_OFFSET) as usize;
    let hashes_at = u32_at(&buf, header::KEY_HASHES_OFFSET) as usize;
    assert_eq!(table % 8, 0);
    assert_eq!(hashes_at, table + 3 * ENTRY_LEN_BYTES);
    let entry_at = |i: usize| u64::from_le_bytes(buf[hashes_at + 8 * i..][..8].try_into().unwrap());
    assert_eq!(
        entry_at(0),
        KEY_HASH_PRESENT | u64::from(murmur2(b"user-1") as u32)
    );
    assert_eq!(entry_at(1), 0);
    assert_eq!(
        entry_at(2),
        KEY_HASH_PRESENT | u64::from(murmur2(b"") as u32)
    );
    assert_eq!(
        u32_at(&buf, header::ARENA_OFFSET) as usize,
        hashes_at + 3 * 8
    );
    // The fast path reads the same hashes from the region alone.
    let fast: Vec<_> = view.key_hashes().unwrap().collect();
    assert_eq!(fast, hashes);
    assert_eq!(u32_at(&buf, table + entry::KEY_LEN), 6);
    assert_eq!(u32_at(&buf, table + entry::KEY_OFFSET), 0);
}

#[test]
fn key_hashes_only_carry_the_count_the_context_and_one_hash_entry_per_record() {
    let buf = encoded_on_dirty_memory(Needs::KEY_HASH_ONLY);
    let view = SlabView::parse(&buf).unwrap();
    assert_eq!(view.len(), 3);
    let hashes: Vec<_> = view.key_hashes().unwrap().collect();
    assert_eq!(hashes, records_key_hashes());
    // No record table: nothing to iterate, and asking for a record says why.
    assert_eq!(view.records().count(), 0);
    assert_eq!(view.record(0).unwrap_err(), LayoutError::NoRecordTable);
    // The layout: a 36-byte header, the context, then the hashes where the table would
    // start, and nothing after them.
    let table = u32_at(&buf, header::TABLE_OFFSET) as usize;
    let hashes_at = u32_at(&buf, header::KEY_HASHES_OFFSET) as usize;
    assert_eq!(hashes_at, table);
    assert_eq!(hashes_at % 8, 0);
    assert_eq!(
        u32_at(&buf, header::ARENA_OFFSET) as usize,
        hashes_at + 3 * 8
    );
    assert_eq!(u32_at(&buf, header::ARENA_LEN), 0);
    assert_eq!(buf.len(), hashes_at + 3 * 8);
    assert_eq!(
        u32_at(&buf, header::FIELDS),
        Needs::KEY_HASH_BIT | Needs::KEY_HASH_ONLY_BIT
    );
    // 48 bytes a record with the table (`key_hash`), 8 without.
    let with_table = encoded_on_dirty_memory(Needs::KEY_HASH);
    assert_eq!(with_table.len() - buf.len(), 3 * ENTRY_LEN_BYTES);
}

#[test]
fn a_hashes_only_region_outside_the_buffer_is_a_typed_error() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::KEY_HASH_ONLY).unwrap();
    let good = enc.encode_to_vec(&records()).unwrap();
    let mut bad = good.clone();
    // One more record than the hashes hold.
    bad[header::RECORD_COUNT..][..4].copy_from_slice(&4u32.to_le_bytes());
    assert!(matches!(
        SlabView::parse(&bad),
        Err(LayoutError::RegionOutOfBounds {
            region: Region::KeyHashes,
            ..
        })
    ));
    // The hashes-only bit with any field besides the hashes is refused.
    let mut mixed = good.clone();
    let bits = Needs::KEY_HASH_BIT | Needs::KEY_HASH_ONLY_BIT | Needs::KEYS_BIT;
    mixed[header::FIELDS..][..4].copy_from_slice(&bits.to_le_bytes());
    assert_eq!(
        SlabView::parse(&mixed).unwrap_err(),
        LayoutError::BadFields { bits }
    );
}

#[test]
fn a_key_hash_routes_like_the_key_with_or_without_the_need() {
    let ctx = context();
    let keys: Vec<Vec<u8>> = (0..300u32).map(|i| format!("k{i}").into_bytes()).collect();
    let recs: Vec<RecordInput> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| RecordInput {
            key: (i % 7 != 0).then_some(k.as_slice()),
            ..RecordInput::default()
        })
        .collect();
    for needs in [
        Needs::KEYS,
        Needs::KEY_HASH,
        Needs::KEYS.with_key_hash(),
        Needs::ALL,
        Needs::ALL.with_key_hash(),
    ] {
        let buf = SlabEncoder::new(ctx.as_ref(), needs)
            .unwrap()
            .encode_to_vec(&recs)
            .unwrap();
        let view = SlabView::parse(&buf).unwrap();
        assert_eq!(view.key_hashes().is_some(), needs.key_hash());
        if let Some(fast) = view.key_hashes() {
            let slow: Vec<_> = view.records().map(|r| r.key_hash().unwrap()).collect();
            assert_eq!(fast.collect::<Vec<_>>(), slow);
        }
        for (r, want) in view.records().zip(&recs) {
            let got = r
                .key_hash()
                .unwrap()
                .and_then(|h| partition_for_hash(h, 12));
            assert_eq!(
                got,
                want.key.and_then(|k| partition_for_key(k, 12)),
                "{needs:?}"
            );
            if needs.keys() {
                assert_eq!(r.key().unwrap(), want.key);
            }
        }
    }
}

#[test]
fn a_key_hash_region_outside_the_buffer_is_a_typed_error() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::KEY_HASH).unwrap();
    let good = enc.encode_to_vec(&records()).unwrap();
    let mut bad = good.clone();
    bad[header::KEY_HASHES_OFFSET..][..4].copy_from_slice(&(good.len() as u32 - 8).to_le_bytes());
    assert!(matches!(
        SlabView::parse(&bad),
        Err(LayoutError::RegionOutOfBounds {
            region: Region::KeyHashes,
            ..
        })
    ));
    // The key-hash word is part of the header: 35 bytes are too short for it.
    let mut short = good[..35].to_vec();
    short[header::CONTEXT_LEN..][..4].copy_from_slice(&0u32.to_le_bytes());
    short[header::TABLE_OFFSET..][..4].copy_from_slice(&0u32.to_le_bytes());
    short[header::ARENA_OFFSET..][..4].copy_from_slice(&0u32.to_le_bytes());
    short[header::RECORD_COUNT..][..4].copy_from_slice(&0u32.to_le_bytes());
    short[header::CONTEXT_OFFSET..][..4].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(
        SlabView::parse(&short).unwrap_err(),
        LayoutError::TooShort { len: 35 }
    );
}

#[test]
fn a_key_pointing_outside_the_arena_is_a_typed_error() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::KEYS).unwrap();
    let mut buf = enc.encode_to_vec(&records()).unwrap();
    let table = u32::from_le_bytes(buf[header::TABLE_OFFSET..][..4].try_into().unwrap()) as usize;
    buf[table + entry::KEY_OFFSET..][..4].copy_from_slice(&u32::MAX.to_le_bytes());
    buf[table + entry::KEY_LEN..][..4].copy_from_slice(&2u32.to_le_bytes());
    let view = SlabView::parse(&buf).unwrap();
    assert_eq!(
        view.record(0).unwrap().key(),
        Err(LayoutError::FieldOutOfBounds {
            record: 0,
            field: Field::Key
        })
    );
}

#[test]
fn malformed_headers_are_reported_once_then_iteration_stops() {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), Needs::HEADERS).unwrap();
    let mut buf = enc.encode_to_vec(&records()).unwrap();
    let table = u32::from_le_bytes(buf[header::TABLE_OFFSET..][..4].try_into().unwrap()) as usize;
    let arena = u32::from_le_bytes(buf[header::ARENA_OFFSET..][..4].try_into().unwrap()) as usize;
    let hoff = u32::from_le_bytes(
        buf[table + entry::HEADERS_OFFSET..][..4]
            .try_into()
            .unwrap(),
    );
    // Claim 3 headers where there are 2.
    buf[arena + hoff as usize..][..4].copy_from_slice(&3u32.to_le_bytes());
    let view = SlabView::parse(&buf).unwrap();
    let items: Vec<_> = view.record(0).unwrap().headers().unwrap().collect();
    assert_eq!(items.len(), 3);
    assert!(items[0].is_ok() && items[1].is_ok());
    assert_eq!(items[2], Err(LayoutError::MalformedHeaders { record: 0 }));
}

#[test]
fn manifest_json_round_trips_and_implies_keys() {
    let json = r#"{"name":"header-route","version":"1.0.0","abi":1,"needs":["headers"],"description":"routes by a header"}"#;
    let m: Manifest = serde_json::from_str(json).unwrap();
    assert_eq!(m.needs, Needs::HEADERS);
    m.validate().unwrap();
    let back = serde_json::to_string(&m).unwrap();
    assert!(back.contains(r#""needs":["keys","headers"]"#), "{back}");
    assert_eq!(serde_json::from_str::<Manifest>(&back).unwrap(), m);
    let unknown = r#"{"name":"x","version":"1","abi":1,"needs":["payload"],"description":""}"#;
    assert!(serde_json::from_str::<Manifest>(unknown).is_err());
    let extra = r#"{"name":"x","version":"1","abi":1,"description":"","colour":"red"}"#;
    assert!(serde_json::from_str::<Manifest>(extra).is_err());
}

/// (parent_offset, committed_at_ms, key, headers, value)
type RawRecord = (u64, i64, Option<Vec<u8>>, Vec<(String, Vec<u8>)>, Vec<u8>);

fn arb_record() -> impl Strategy<Value = RawRecord> {
    (
        any::<u64>(),
        any::<i64>(),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
        proptest::collection::vec(
            (".{0,8}", proptest::collection::vec(any::<u8>(), 0..8)),
            0..3,
        ),
        proptest::collection::vec(any::<u8>(), 0..32),
    )
}

fn arb_context() -> impl Strategy<Value = RouteContext> {
    (
        ".{0,12}",
        any::<u32>(),
        any::<u32>(),
        ".{0,12}",
        any::<u32>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(pt, pp, ppc, ct, cpc, attempt, config)| RouteContext {
            parent_topic: pt,
            parent_partition: pp,
            parent_partition_count: ppc,
            child_topic: ct,
            child_partition_count: cpc,
            attempt,
            config,
        })
}

proptest! {
    #[test]
    fn any_slab_round_trips(
        ctx in arb_context(),
        raw in proptest::collection::vec(arb_record(), 0..20),
        headers in any::<bool>(),
        values in any::<bool>(),
        keys in any::<bool>(),
        key_hash in any::<bool>(),
    ) {
        let header_bytes: Vec<Vec<(&[u8], &[u8])>> = raw
            .iter()
            .map(|r| r.3.iter().map(|(n, v)| (n.as_bytes(), v.as_slice())).collect())
            .collect();
        let recs: Vec<RecordInput> = raw
            .iter()
            .zip(&header_bytes)
            .map(|(r, h)| RecordInput {
                parent_offset: r.0,
                committed_at_ms: r.1,
                key: r.2.as_deref(),
                headers: h,
                value: &r.4,
            })
            .collect();
        let needs = Needs::from_flags(keys, headers, values, key_hash);
        let enc = SlabEncoder::new(ctx.as_ref(), needs).unwrap();
        let buf = enc.encode_to_vec(&recs).unwrap();
        let view = SlabView::parse(&buf).unwrap();
        prop_assert_eq!(view.context().unwrap(), ctx.as_ref());
        let postcard_bytes = postcard::to_allocvec(&ctx).unwrap();
        prop_assert_eq!(view.context_bytes(), postcard_bytes.as_slice());
        prop_assert_eq!(view.len(), recs.len());
        if let Some(fast) = view.key_hashes() {
            let want: Vec<_> = recs.iter().map(|r| r.key.map(|k| murmur2(k) as u32)).collect();
            prop_assert_eq!(fast.collect::<Vec<_>>(), want);
        }
        for (r, want) in view.records().zip(&recs) {
            prop_assert_eq!(r.parent_offset(), want.parent_offset);
            prop_assert_eq!(r.committed_at_ms(), want.committed_at_ms);
            prop_assert_eq!(r.has_key(), want.key.is_some());
            prop_assert_eq!(r.key_hash().unwrap(), want.key.map(|k| murmur2(k) as u32));
            if needs.keys() {
                prop_assert_eq!(r.key().unwrap(), want.key);
            }
            if values {
                prop_assert_eq!(r.value().unwrap(), want.value);
            }
            if headers {
                let got: Vec<(&[u8], &[u8])> = r
                    .headers()
                    .unwrap()
                    .map(|h| h.map(|h| (h.name.as_bytes(), h.value)))
                    .collect::<Result<_, _>>()
                    .unwrap();
                prop_assert_eq!(got, want.headers.to_vec());
            }
        }
    }

    #[test]
    fn hostile_bytes_never_panic_the_reader(buf in proptest::collection::vec(any::<u8>(), 0..256), prefix in any::<bool>()) {
        let mut buf = buf;
        if prefix && buf.len() >= 4 {
            buf[..4].copy_from_slice(&MAGIC);
        }
        if let Ok(view) = SlabView::parse(&buf) {
            let _ = view.context();
            for r in view.records() {
                let _ = (r.key(), r.key_hash(), r.value(), r.parent_offset(), r.committed_at_ms());
                if let Ok(hs) = r.headers() {
                    for h in hs.take(64) {
                        let _ = h;
                    }
                }
            }
        }
    }

    #[test]
    fn mutated_valid_slabs_never_panic_the_reader(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        shape in 0..3u8,
    ) {
        let ctx = context();
        let needs = match shape {
            0 => Needs::ALL,
            1 => Needs::ALL.with_key_hash(),
            _ => Needs::KEY_HASH_ONLY,
        };
        let enc = SlabEncoder::new(ctx.as_ref(), needs).unwrap();
        let mut buf = enc.encode_to_vec(&records()).unwrap();
        for (i, b) in flips {
            let at = i.index(buf.len());
            buf[at] = b;
        }
        if let Ok(view) = SlabView::parse(&buf) {
            let _ = view.context();
            if let Some(fast) = view.key_hashes() {
                prop_assert_eq!(fast.count(), view.len());
            }
            for r in view.records() {
                let _ = (r.key(), r.key_hash(), r.value());
                if let Ok(hs) = r.headers() {
                    let n = hs.take(16).count();
                    prop_assert!(n <= 16);
                }
            }
        }
    }

    #[test]
    fn postcard_contexts_decode_with_the_hand_written_decoder(ctx in arb_context()) {
        let bytes = postcard::to_allocvec(&ctx).unwrap();
        prop_assert_eq!(RouteContextRef::decode(&bytes).unwrap(), ctx.as_ref());
    }
}

#[test]
fn key_hashes_alone_are_measured_from_the_count_whatever_the_iterator_says_of_its_length() {
    for needs in [Needs::KEY_HASH, Needs::KEY_HASH_ONLY] {
        key_hashes_measured_from_the_count(needs);
    }
}

fn key_hashes_measured_from_the_count(needs: Needs) {
    let ctx = context();
    let enc = SlabEncoder::new(ctx.as_ref(), needs).unwrap();
    let recs = records();
    let exact = enc.layout(&recs).unwrap();
    // An iterator that does not know its length (a filter) is counted instead.
    let counted = enc.layout(recs.iter().filter(|_| true)).unwrap();
    assert_eq!(exact, counted);
    assert_eq!(exact.record_count(), recs.len());
    // Records other than the measured ones are refused, not written past the layout.
    let mut buf = vec![0; exact.total_len() + 64];
    assert_eq!(
        enc.write(&exact, recs.iter().chain(recs.iter().take(1)), &mut buf),
        Err(EncodeError::LayoutMismatch)
    );
    assert_eq!(
        enc.write(&exact, recs.iter().take(2), &mut buf),
        Err(EncodeError::LayoutMismatch)
    );
}
