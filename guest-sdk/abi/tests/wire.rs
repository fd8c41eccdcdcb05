//! Round trips between the host-side encoder and the guest-side reader, byte compatibility of
//! the hand-written context codec with postcard, the manifest JSON, and hostile input.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use narad_abi::layout::{ENTRY_LEN_BYTES, HEADER_LEN_BYTES, MAGIC, entry, header};
use narad_abi::{
    EncodeError, Field, LayoutError, Manifest, Needs, RecordInput, Region, RouteContext,
    RouteContextRef, SlabEncoder, SlabView,
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

    let mut bad = good.clone();
    bad[header::FIELDS..][..4].copy_from_slice(&8u32.to_le_bytes());
    assert_eq!(
        SlabView::parse(&bad).unwrap_err(),
        LayoutError::BadFields { bits: 8 }
    );

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
        let needs = Needs::new(headers, values);
        let enc = SlabEncoder::new(ctx.as_ref(), needs).unwrap();
        let buf = enc.encode_to_vec(&recs).unwrap();
        let view = SlabView::parse(&buf).unwrap();
        prop_assert_eq!(view.context().unwrap(), ctx.as_ref());
        let postcard_bytes = postcard::to_allocvec(&ctx).unwrap();
        prop_assert_eq!(view.context_bytes(), postcard_bytes.as_slice());
        prop_assert_eq!(view.len(), recs.len());
        for (r, want) in view.records().zip(&recs) {
            prop_assert_eq!(r.parent_offset(), want.parent_offset);
            prop_assert_eq!(r.committed_at_ms(), want.committed_at_ms);
            prop_assert_eq!(r.key().unwrap(), want.key);
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
                let _ = (r.key(), r.value(), r.parent_offset(), r.committed_at_ms());
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
    ) {
        let ctx = context();
        let enc = SlabEncoder::new(ctx.as_ref(), Needs::ALL).unwrap();
        let mut buf = enc.encode_to_vec(&records()).unwrap();
        for (i, b) in flips {
            let at = i.index(buf.len());
            buf[at] = b;
        }
        if let Ok(view) = SlabView::parse(&buf) {
            let _ = view.context();
            for r in view.records() {
                let _ = (r.key(), r.value());
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
