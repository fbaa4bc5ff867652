//! Property tests of the sans-IO codec: arbitrary bytes never panic it, and how the bytes are
//! split into reads never changes what it answers.

use proptest::prelude::*;
use salsa_nbd::fuzzing::drive;
use salsa_nbd::proto::*;

fn request(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let payload = if kind == CMD_WRITE {
        vec![0xAB; length as usize]
    } else {
        Vec::new()
    };
    encode_request(flags, kind, cookie, offset, length, &payload)
}

/// A plausible client session: flags, some options (valid or not), GO, some requests.
fn session() -> impl Strategy<Value = Vec<u8>> {
    let option = prop_oneof![
        Just(encode_option(OPT_STRUCTURED_REPLY, &[])),
        Just(encode_option(OPT_LIST, &[])),
        (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(o, d)| encode_option(o % 20, &d)),
    ];
    let req = (
        0u16..32,
        0u16..10,
        any::<u64>(),
        prop_oneof![Just(0u64), any::<u64>(), 0u64..(1 << 30)],
        prop_oneof![Just(0u32), 1u32..9000],
    )
        .prop_map(|(f, k, c, o, l)| request(f, k, c, o, l));
    (proptest::collection::vec(option, 0..6), proptest::collection::vec(req, 0..10)).prop_map(|(opts, reqs)| {
        let mut v = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes().to_vec();
        for o in opts {
            v.extend(o);
        }
        let mut go = 0u32.to_be_bytes().to_vec();
        go.extend_from_slice(&0u16.to_be_bytes());
        v.extend(encode_option(OPT_GO, &go));
        for r in reqs {
            v.extend(r);
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600), chunks in proptest::collection::vec(1usize..64, 1..8)) {
        drive(&input, &chunks);
    }

    #[test]
    fn answers_do_not_depend_on_how_bytes_arrive(input in session(), chunks in proptest::collection::vec(1usize..100, 1..8)) {
        let whole = drive(&input, &[input.len().max(1)]);
        let split = drive(&input, &chunks);
        prop_assert_eq!(whole, split);
    }
}
