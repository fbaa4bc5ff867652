//! Property tests of the sans-IO codec: arbitrary bytes never panic it, and how the bytes are
//! split into reads never changes what it answers.

use proptest::prelude::*;
use salsa_nbd::fuzzing::drive;
use salsa_nbd::proto::*;

fn opt(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn request(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut v = REQUEST_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&length.to_be_bytes());
    if kind == CMD_WRITE {
        v.extend(std::iter::repeat_n(0xAB, length as usize));
    }
    v
}

/// A plausible client session: flags, some options (valid or not), GO, some requests.
fn session() -> impl Strategy<Value = Vec<u8>> {
    let option = prop_oneof![
        Just(opt(OPT_STRUCTURED_REPLY, &[])),
        Just(opt(OPT_LIST, &[])),
        (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(o, d)| opt(o % 20, &d)),
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
        v.extend(opt(OPT_GO, &go));
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
